"""`python -m tooling.cli up|demo`: the platform on one machine, and the scripted tenant flow.

up   — starts NATS + PostgreSQL (embedded unless TESSERA_NATS_URL / TESSERA_DATABASE_URL are
       set), every service, seeds a demo inventory (2 nodes × 8 GPUs), tenant and user, prints
       the gateway URL and the demo API key, and runs until Ctrl-C, then stops everything.
demo — the same on a fresh temporary platform, then: create an allocation, wait for ACTIVE,
       release, wait for RELEASED, printing each state change; exits 0 on success.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from .client import TesseraClient
from .embedded import REPO
from .platform import Platform


async def seed(platform: Platform) -> dict:
    """Demo tenant, user and two nodes; idempotent across restarts of the same data folder."""
    path = platform.workdir / "seed.json"
    if path.exists():
        data = json.loads(path.read_text())
        for node_id in data["nodes"]:
            await platform.start_node_agent(node_id)
        return data
    async with platform.admin() as admin:
        tenant = await admin.create_tenant("demo")
        user = await admin.create_user(tenant["id"], "demo-user", "tenant_user")
        # quotas are explicit: a tenant may use what the provider granted it, per GPU model and pool
        await admin.set_quota(tenant["id"], "shared", "H100", 16)
    nodes = [await platform.add_node(f"demo-node-{i}", "H100", 8) for i in ("a", "b")]
    data = {"tenant_id": tenant["id"], "user_id": user["id"], "api_key": user["api_key"], "nodes": nodes}
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return data


def _platform(workdir: Path, **kw) -> Platform:
    return Platform(workdir, nats_url=os.environ.get("TESSERA_NATS_URL") or None,
                    database_url=os.environ.get("TESSERA_DATABASE_URL") or None, **kw)


async def up(workdir: Path, port: int | None) -> int:
    platform = _platform(workdir, gateway_port=port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await platform.start()
        data = await seed(platform)
        print(f"\nTessera is up.\n  gateway:      {platform.gateway_url}\n  demo API key: {data['api_key']}\n"
              f"  admin key:    {platform.admin_key}\n  logs:         {platform.workdir / 'logs'}\n"
              f"  try: curl -s -X POST -H 'Authorization: ApiKey {data['api_key']}' {platform.gateway_url}/v1/auth/token\n"
              "Ctrl-C stops everything.", flush=True)
        await stop.wait()
    finally:
        print("stopping…", flush=True)
        await platform.stop()
    return 0


async def demo() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="tessera-demo-"))
    platform = _platform(workdir, durable=False)
    try:
        await platform.start()
        data = await seed(platform)
        async with TesseraClient(platform.gateway_url, data["api_key"]) as tenant:
            alloc = await tenant.create_allocation("demo-training", shape="vm.2gpu", volume_gb=100)
            print(f"created allocation {alloc['id']}: {alloc['state']}", flush=True)
            seen = [alloc["state"]]

            async def follow(targets: set[str]) -> dict:
                while True:
                    a = await tenant.wait_state(alloc["id"], {s for s in
                        ("REQUESTED", "PROVISIONING", "ACTIVE", "RELEASING", "RELEASED", "FAILED") if s != seen[-1]}, 60)
                    seen.append(a["state"])
                    print(f"  → {a['state']}" + (f" (node {a.get('node_id')})" if a["state"] == "ACTIVE" else "")
                          + (f" at {a.get('failed_step')}: {a.get('reason')}" if a["state"] == "FAILED" else ""), flush=True)
                    if a["state"] in targets | {"FAILED"}:
                        return a

            a = await follow({"ACTIVE"})
            if a["state"] != "ACTIVE":
                return 1
            await tenant.release(alloc["id"])
            print("release requested", flush=True)
            a = await follow({"RELEASED"})
            print("demo finished: " + " → ".join(seen), flush=True)
            return 0 if a["state"] == "RELEASED" else 1
    finally:
        await platform.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="run the platform until Ctrl-C")
    p_up.add_argument("--data", default=os.environ.get("TESSERA_DATA_DIR", str(REPO / ".tessera")))
    p_up.add_argument("--port", type=int, default=int(os.environ.get("TESSERA_GATEWAY_PORT", "8080")))
    sub.add_parser("demo", help="scripted tenant flow on a fresh platform")
    args = parser.parse_args(argv)
    if args.cmd == "up":
        return asyncio.run(up(Path(args.data), args.port))
    return asyncio.run(demo())


if __name__ == "__main__":
    sys.exit(main())
