"""`python -m tooling.cli up|demo`: the platform on one machine, and the scripted tenant flow.

up   — starts NATS + PostgreSQL (embedded unless TESSERA_NATS_URL / TESSERA_DATABASE_URL are
       set), every service, seeds a demo inventory (2 nodes × 8 GPUs), a tenant with a tenant admin
       and a tenant user, prints the gateway URL and their API keys, and runs until SIGINT (Ctrl-C),
       SIGTERM or SIGHUP, then stops everything. Meanwhile a service or node-agent that exits is started
       again, with backoff (`--no-restart` or TESSERA_RUNNER_RESTART=no: not; docs/operations.md).
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
from datetime import UTC, datetime, timedelta
from pathlib import Path

from .client import ApiError, TesseraClient
from .demo_baremetal import POOL as BM_POOL
from .demo_baremetal import TAINT as BM_TAINT
from .demo_baremetal import TOLERATION as BM_TOLERATION
from .demo_baremetal import WIPE_POLICY, DemoBareMetal
from .demo_lab import WIPE_POLICY as LAB_WIPE_POLICY
from .demo_lab import DemoLab
from .demo_paas import TOLERATION as PAAS_TOLERATION
from .demo_paas import paas_nodes
from .demo_spot import POOL as SPOT_POOL
from .demo_spot import TOLERATION as SPOT_TOLERATION
from .demo_spot import spot_offering
from .embedded import REPO
from .platform import Platform


async def demo_lab(platform: Platform, seeded: dict | None) -> DemoLab | None:
    """The demo nodes' lab when it can run (TESSERA_DEMO_NODES: auto [default], lab, sim), else None after one line
    saying why; a data folder seeded with sim nodes keeps them. Its teardown runs when the platform stops."""
    wanted = os.environ.get("TESSERA_DEMO_NODES", "auto")
    if wanted not in ("auto", "lab", "sim"):
        raise SystemExit(f"TESSERA_DEMO_NODES={wanted!r}: expected auto, lab or sim")
    if wanted == "sim" or (seeded is not None and seeded.get("demo_nodes", "sim") == "sim"):
        print("demo nodes: sim driver, no dataplane (allocations boot nothing)", flush=True)
        return None
    lab = DemoLab(platform.workdir)
    platform.on_stop.append(lab.stop)   # first: a signal during the preparation still removes what it made
    why = await asyncio.to_thread(lab.prepare)   # pyroute2's sync API runs an event loop of its own
    if why is not None:
        if wanted == "lab" or seeded is not None:
            raise SystemExit(f"demo nodes: the lab cannot run: {why}")
        print(f"demo nodes: sim driver, no dataplane: the real lab cannot run here: {why}", flush=True)
        return None
    print(f"demo nodes: a real lab: libvirt (QEMU, TCG) guests from {lab.image.name}, kernel dataplane in "
          f"namespaces {lab.lab.fabric[:-4]}-*", flush=True)
    return lab


async def _register_image(platform: Platform, lab: DemoLab) -> None:
    async with platform.admin() as admin:
        status, body, _ = await admin.request("POST", "/v1/images", json_body=lab.catalog_entry(), expect=(201, 409))
    if status == 201:
        print(f"guest image {body['name']} registered (public, default)", flush=True)


async def bare_metal(platform: Platform, data: dict, lab: DemoLab | None) -> None:
    """The bare-metal demo node (with the VM lab only): made fresh at each start, its server cabled to a leaf on the
    VM lab's underlay; its node and BMC registered once and updated on later starts. One line says why when it
    cannot run."""
    if lab is None:
        return
    bm = DemoBareMetal(platform.workdir, fabric=(lab.lab.fabric, "ul"))
    platform.on_stop.insert(0, bm.stop)
    try:
        await asyncio.to_thread(bm.prepare)
    except (OSError, RuntimeError) as exc:
        print(f"bare-metal demo node: cannot run here: {str(exc).splitlines()[0][:300]}", flush=True)
        return
    # the services started before the leaf existed (a new one at each start): the network service learns it
    await platform.restart("network", env=bm.network_env())
    async with platform.admin() as admin:
        if data.get("bm_node") is None:
            await admin.define_pool(BM_POOL, "pack", BM_TAINT)
            await admin.set_quota(data["tenant_id"], BM_POOL, "H100", 8)
            data["bm_node"] = await platform.add_node("demo-bm-a", "H100", 8, env=bm.node_env(), pool=BM_POOL,
                                                      wipe_policy=WIPE_POLICY)
        else:
            await platform.start_node_agent(data["bm_node"], bm.node_env())
        await admin.request("PUT", f"/v1/nodes/{data['bm_node']}/bmc", json_body=bm.bmc_body())
    print(f"bare-metal demo node: a server behind a Redfish BMC (sushy-emulator) at {bm.lab.emulator.url}; "
          f"pool {BM_POOL}, shape bm.8gpu, toleration {BM_TOLERATION}", flush=True)
    if bm.lab.switch_port is not None:
        data["bm_switch_port"] = bm.lab.switch_port


async def seed(platform: Platform, *, paas: bool = False, spot: bool = False) -> dict:
    """Demo tenant with a tenant admin and a tenant user, its quota, and two nodes (a real lab when it can run,
    see ``demo_lab``), with ``paas`` two nodes for tenant clusters (``demo_paas``), and with ``spot`` a pool of two
    nodes sold as spot (``demo_spot``); idempotent across restarts of the same data folder (the nodes' agents are
    started again, as the same nodes)."""
    path = platform.workdir / "seed.json"
    seeded = json.loads(path.read_text()) if path.exists() else None
    lab = await demo_lab(platform, seeded)
    if lab is not None:
        await _register_image(platform, lab)
    if seeded is not None:
        data = seeded
        for index, node_id in enumerate(data["nodes"]):   # the lab's devices are new at each start
            # a folder seeded before the wipe approved its nodes with the default policy (NVMe format only): their
            # wipes stay simulated rather than quarantine every slot of a loop device
            await platform.start_node_agent(node_id, lab.node_env(index, data.get("wipe_disks", False)) if lab else None)
        if "admin_api_key" not in data:   # a data folder seeded before the demo tenant had an admin
            tenant_admin = await _new_tenant_admin(platform, data["tenant_id"])
            data.update(admin_id=tenant_admin["id"], admin_api_key=tenant_admin["api_key"])
        await bare_metal(platform, data, lab)
        if paas:
            await paas_nodes(platform, data)
        if spot:
            await spot_offering(platform, data)
        _write_seed(path, data)
        return data
    async with platform.admin() as admin:
        tenant = await admin.create_tenant("demo")
        tenant_admin = await admin.create_user(tenant["id"], "demo-admin", "tenant_admin")
        user = await admin.create_user(tenant["id"], "demo-user", "tenant_user")
        # quotas are explicit: a tenant may use what the provider granted it, per GPU model and pool
        await admin.set_quota(tenant["id"], "shared", "H100", 16)
        # a first price list, so that usage is rated from the start (a provider publishes its own: PUT
        # /v1/price-lists/{version}); it takes effect shortly after the start, never in the past
        await admin.publish_price_list("demo-1", DEMO_PRICES | {
            "effective_from": (datetime.now(UTC) + timedelta(seconds=20)).isoformat()})
    nodes = []
    for index, letter in enumerate("ab"):
        nodes.append(await platform.add_node(f"demo-node-{letter}", "H100", 8,
                                             env=lab.node_env(index) if lab else None,
                                             wipe_policy=LAB_WIPE_POLICY if lab else None))
        if lab is not None:
            lab.add_node(nodes[-1])
    data = {"tenant_id": tenant["id"], "user_id": user["id"], "api_key": user["api_key"],
            "admin_id": tenant_admin["id"], "admin_api_key": tenant_admin["api_key"], "nodes": nodes,
            "demo_nodes": "lab" if lab else "sim", "wipe_disks": lab is not None}
    await bare_metal(platform, data, lab)
    if paas:
        await paas_nodes(platform, data)
    if spot:
        await spot_offering(platform, data)
    _write_seed(path, data)
    return data


async def _new_tenant_admin(platform: Platform, tenant_id: str) -> dict:
    """A new tenant admin of the demo tenant (an API key is shown once: a lost one means a new admin);
    named demo-admin, or demo-admin-2, -3… when that name is taken."""
    async with platform.admin() as admin:
        for n in range(1, 100):
            try:
                return await admin.create_user(tenant_id, "demo-admin" if n == 1 else f"demo-admin-{n}", "tenant_admin")
            except ApiError as exc:
                if exc.status != 409:
                    raise
    raise RuntimeError("the demo tenant has no free demo-admin name left")


DEMO_PRICES = {"currency": "USD", "spot_discount_bps": 6000,
               "gpu_prices": [{"micros_per_gpu_hour": 3_200_000}, {"micros_per_gpu_hour": 2_900_000, "shape": "bm.8gpu"}],
               "storage_prices": {"standard": 150, "lustre": 300, "vast": 250, "weka": 300}}


# what holds for one start only (a new leaf at each start): shown in the banner, never kept in seed.json
_THIS_START = ("bm_switch_port",)


def _write_seed(path: Path, data: dict) -> None:
    path.write_text(json.dumps({k: v for k, v in data.items() if k not in _THIS_START}))
    path.chmod(0o600)


def banner(platform: Platform, data: dict) -> str:
    """What `up` prints once everything runs: the gateway, the demo tenant's keys (its admin's and its user's)
    and the provider admin's, and a first few calls to try as the tenant admin."""
    url, tenant, key = platform.gateway_url, data["tenant_id"], data["admin_api_key"]
    bearer, as_json = '-H "Authorization: Bearer $TOKEN"', "-H 'Content-Type: application/json'"
    return "\n".join([
        "",
        "Tessera is up.",
        f"  gateway:            {url}   (the API: {url}/openapi.json)",
        f"  demo tenant:        {tenant}",
        f"  tenant admin key:   {key}   (its users, their quotas, networks and rules, allocations)",
        f"  tenant user key:    {data['api_key']}   (allocations, networks)",
        f"  provider admin key: {platform.admin_key}   (tenants, their quotas, nodes, pools, shapes)",
        f"  logs:               {platform.workdir / 'logs'}",
        f"  dashboard:          {url}/ui/   (sign in with a key above; the provider admin's shows the fleet)",
        "  try the CLI, as the tenant admin (docs/cli.md):",
        f"    .venv/bin/tessera login {url} --api-key {key}",
        "    .venv/bin/tessera alloc create train-1 --shape vm.1gpu --wait   (the saga live; then: alloc list -w)",
        "  or curl, as the tenant admin (the same with the tenant user's key for a user's view):",
        f"    TOKEN=$(curl -s -X POST -H 'Authorization: ApiKey {key}' {url}/v1/auth/token"
        " | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"access_token\"])')",
        f"    curl -s {bearer} {url}/v1/tenants/{tenant}/quotas",
        f"    curl -s {bearer} {as_json} -d '{{\"name\": \"alice\", \"role\": \"tenant_user\"}}' {url}/v1/tenants/{tenant}/users",
        f"    curl -s {bearer} {as_json} -d '{{\"name\": \"train-1\", \"shape\": \"vm.1gpu\"}}' {url}/v1/allocations",
        f"    curl -s {bearer} {url}/v1/price-lists   (demo-1: 3.20 USD per GPU-hour, bare metal 2.90, 60 % off spot)",
        f"    curl -s {bearer} '{url}/v1/usage?group_by=hour'   and   {url}/v1/invoices   (the draft grows)",
        f"    curl -s {bearer} {as_json} -d '{{\"name\": \"data\", \"size_bytes\": 52428800}}' {url}/v1/volumes"
        "   (50 MB on btrfs; classes: /v1/storage-classes)",
        f"    curl -s {bearer} {as_json} -d '{{\"name\": \"train-2\", \"shape\": \"vm.1gpu\", \"volumes\": "
        f"[{{\"volume_id\": \"<the volume's id>\"}}]}}' {url}/v1/allocations   (at /mnt/data in the guest)",
        *([f"    curl -s {bearer} {as_json} -d '{{\"name\": \"server-1\", \"shape\": \"bm.8gpu\", \"pool\": "
           f"\"{BM_POOL}\", \"tolerations\": [\"{BM_TOLERATION}\"]}}' {url}/v1/allocations   (bare metal)"]
          if data.get("bm_node") else []),
        *([f"    (the server's port is on leaf {data['bm_switch_port'].replace('/', ', port ')}: the provisioning "
           "VLAN until hand-off, then the tenant network's VXLAN on the VM nodes' underlay)"]
          if data.get("bm_node") and data.get("bm_switch_port") else []),
        *(["  tenant clusters (Slurm, Ray) on the PaaS demo nodes, as the tenant admin (docs/paas.md):",
           "    .venv/bin/tessera cluster create hpc --kind slurm --shape vm.1gpu --nodes 2 --pool paas "
           f"--toleration {PAAS_TOLERATION}",
           "    .venv/bin/tessera job submit <cluster id> hello --tasks 2 --gpus-per-task 1 -- hostname"]
          if data.get("paas_nodes") else []),
        *(["  spot: pool spot's idle GPUs are sold as spot (docs/paas.md \"Spot\"); as the provider admin:",
           f"    .venv/bin/tessera login {url} --api-key {platform.admin_key} && .venv/bin/tessera spot get spot -w",
           "    and, as the tenant, take a node back with 30 s of notice: .venv/bin/tessera alloc create paid "
           f"--shape vm.8gpu --pool {SPOT_POOL} --toleration {SPOT_TOLERATION} --wait"]
          if data.get("spot_nodes") else []),
        "Ctrl-C stops everything.",
    ])


# `up` is a demo: running meters are cut every 30 s so that usage and the draft invoice visibly grow (a provider's
# deployment keeps the default, 300 s: docs/billing.md); TESSERA_BILLING_CUT_S in the environment wins
UP_ENV = {"TESSERA_BILLING_CUT_S": os.environ.get("TESSERA_BILLING_CUT_S") or "30"}


def _platform(workdir: Path, **kw) -> Platform:
    try:
        return Platform(workdir, nats_url=os.environ.get("TESSERA_NATS_URL") or None,
                        nats_creds=os.environ.get("TESSERA_NATS_CREDS_DIR") or None,
                        database_url=os.environ.get("TESSERA_DATABASE_URL") or None, **kw)
    except ValueError as exc:   # a setting it cannot use (TESSERA_RUNNER_RESTART)
        raise SystemExit(str(exc)) from None


async def up(workdir: Path, port: int | None, restart: bool = True) -> int:
    """Run the platform until SIGINT, SIGTERM or SIGHUP (Ctrl-C, a supervisor, `kill`, a closed terminal), then
    stop everything it started. A signal while it is still starting stops the start too. 0 after a signal once
    it was up, 128 + the signal's number before. Meanwhile a service or node-agent that exits is started again
    (``tooling.supervision``), unless ``restart`` is false or TESSERA_RUNNER_RESTART says ``no``."""
    platform = _platform(workdir, gateway_port=port, env=UP_ENV, supervise=None if restart else False)
    main = asyncio.current_task()
    signalled: list[int] = []

    def on_signal(sig: int) -> None:
        if not signalled:   # the first one stops; stopping is bounded, so later ones need not force it
            signalled.append(sig)
            main.cancel()

    loop = asyncio.get_running_loop()
    me = os.getpid()

    # Not loop.add_signal_handler: it routes signals through a wakeup socket that a forked child inherits, and
    # the demo lab's pyroute2 enters network namespaces in forked children it stops with SIGTERM: that signal
    # would stop the platform while it starts (shared/runtime.py's run_forever does the same, for the same reason).
    def handler(signum: int, _frame) -> None:
        if os.getpid() != me:
            os._exit(0)   # a forked child told to stop
        loop.call_soon_threadsafe(on_signal, signum)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):   # SIGHUP: its terminal went away
        signal.signal(sig, handler)
    was_up = False
    try:
        await platform.start()
        data = await seed(platform, paas=os.environ.get("TESSERA_DEMO_PAAS", "1") != "0",
                          spot=os.environ.get("TESSERA_DEMO_SPOT", "1") != "0")
        print(banner(platform, data), flush=True)
        was_up = True
        await asyncio.Event().wait()   # until a signal cancels this task
    except asyncio.CancelledError:
        if not signalled:
            raise
        main.uncancel()
    finally:
        try:
            print("stopping…", flush=True)
        except OSError:   # no terminal any more: stop all the same
            pass
        await platform.stop()
    return 0 if was_up else 128 + signalled[0]


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
    p_up.add_argument("--no-restart", dest="restart", action="store_false",
                      help="leave a service or node-agent that exits down (default: start it again, with backoff)")
    sub.add_parser("demo", help="scripted tenant flow on a fresh platform")
    args = parser.parse_args(argv)
    if args.cmd == "up":
        return asyncio.run(up(Path(args.data), args.port, args.restart))
    return asyncio.run(demo())


if __name__ == "__main__":
    sys.exit(main())
