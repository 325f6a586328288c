"""`./taskw bench:storage` — not a test. Tenant volumes through the platform against the same work done directly,
in the same run. Needs root (the btrfs loop file system, libvirt).

1. Create and delete, N volumes (default 20) one after the other through the gateway, the storage service and its
   btrfs backend: create = POST /v1/volumes → the volume ``available`` (GET polled every 10 ms); delete = DELETE →
   GET 404. Baseline: on the same file system, ``btrfs subvolume create`` + ``btrfs qgroup limit`` (create) and
   ``btrfs subvolume delete --commit-after`` (delete) run directly, N times. Ratios = platform / direct (p50).
2. Sequential write inside a guest: a VM slice (libvirt, QEMU under TCG) with a volume mounted at /mnt/<name>
   through virtiofs writes ``dd if=/dev/zero bs=1M count=M conv=fsync`` into it, from its serial shell; the same
   dd on the host into a subvolume of the same file system. MB/s of each (timed around the command; an empty
   command's round trip through the serial shell is subtracted) and their ratio.

The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.bench.bench_vm import new_platform, remove_domains, start_platform
from tests.bench.common import log_problems, pct, work_dir
from tests.support import vm
from tests.support.guest import GuestShell
from tooling.client import ApiError, TesseraClient

MIB = 1 << 20


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


async def until(probe, timeout: float = 60.0, interval: float = 0.01):
    deadline = time.monotonic() + timeout
    while True:
        found = await probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError("the volume did not get there in time")
        await asyncio.sleep(interval)


async def through_platform(client: TesseraClient, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        t0 = time.perf_counter()
        v = await client.create_volume(f"bench-{i}-{uuid.uuid4().hex[:6]}", 64 * MIB)

        async def available(v=v):
            got = await client.volume(v["id"])
            if got["state"] in ("rejected", "error"):
                raise RuntimeError(f"volume {v['id']} {got['state']}: {got.get('reason')}")
            return got if got["state"] == "available" else None
        await until(available)
        t1 = time.perf_counter()
        await client.delete_volume(v["id"])

        async def gone(v=v):
            try:
                await client.volume(v["id"])
            except ApiError as exc:
                if exc.status == 404:
                    return True
                raise
            return None
        await until(gone)
        rows.append({"create_s": t1 - t0, "delete_s": time.perf_counter() - t1})
    return rows


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def direct(root: Path, n: int) -> list[dict]:
    """What the backend does for a volume, run by hand on the same file system."""
    base = root / "bench-direct"
    base.mkdir(exist_ok=True)
    rows = []
    for i in range(n):
        path = base / f"v{i}"
        t0 = time.perf_counter()
        run("btrfs", "subvolume", "create", str(path))
        run("btrfs", "qgroup", "limit", str(64 * MIB), str(path))
        t1 = time.perf_counter()
        run("btrfs", "subvolume", "delete", "--commit-after", str(path))
        rows.append({"create_s": t1 - t0, "delete_s": time.perf_counter() - t1})
    base.rmdir()
    return rows


def host_write(root: Path, mib: int) -> float:
    path = root / "bench-host-write"
    run("btrfs", "subvolume", "create", str(path))
    try:
        t0 = time.perf_counter()
        run("dd", "if=/dev/zero", f"of={path}/f", "bs=1M", f"count={mib}", "conv=fsync")
        return mib * MIB / 1e6 / (time.perf_counter() - t0)
    finally:
        run("btrfs", "subvolume", "delete", "--commit-after", str(path))


async def guest_write(p, client: TesseraClient, mib: int) -> tuple[float, float]:
    """(MB/s of the dd inside the guest, the shell's empty round trip in s)."""
    v = await client.create_volume(f"bench-guest-{uuid.uuid4().hex[:6]}", (mib + 64) * MIB)
    await client.wait_volume(v["id"], "available")
    a = await client.create_allocation("bench-storage", "vm.1gpu", volumes=[{"volume_id": v["id"], "mode": "rw"}],
                                       **p.opts)
    a = await client.wait_state(a["id"], "ACTIVE", timeout=300)
    try:
        with GuestShell(vm.console_socket(a["id"])) as sh:
            t0 = time.perf_counter()
            sh.run("true", 30)
            empty = time.perf_counter() - t0
            t0 = time.perf_counter()
            rc, out = sh.run(f"dd if=/dev/zero of=/mnt/{v['name']}/f bs=1M count={mib} conv=fsync", 600)
            took = time.perf_counter() - t0 - empty
            if rc != 0:
                raise RuntimeError(f"dd in the guest failed: {out}")
        return mib * MIB / 1e6 / took, empty
    finally:
        await client.release(a["id"])
        await client.wait_state(a["id"], "RELEASED", timeout=300)
        await client.delete_volume(v["id"])


async def main(n: int, mib: int) -> dict:
    image = await asyncio.to_thread(vm.host_ready)
    work = work_dir("tessera-bench-storage-")
    say(f"work dir (service logs: logs/): {work}")
    p = new_platform(work, 1)
    try:
        await start_platform(p, work, image)
        root = p.storage.root
        async with TesseraClient(p.gateway_url, p.api_key) as client:
            await client.token()
            await through_platform(client, 2)                       # warm-up
            platform_rows = await through_platform(client, n)
            direct_rows = await asyncio.to_thread(direct, root, n)
            guest_mbs, empty = await guest_write(p, client, mib)
        host_mbs = await asyncio.to_thread(host_write, root, mib)
        logs = log_problems(list((work / "logs").glob("*.log")))
    finally:
        try:
            await p.stop()
        finally:
            await asyncio.to_thread(remove_domains, work, list(p.state_dirs))
            await asyncio.to_thread(p.lab.destroy)
            shutil.rmtree(work, ignore_errors=True)
    def q(rows, k, x):
        return round(pct([r[k] for r in rows], x), 4)
    result = {
        "benchmark": "storage", "n": n,
        "create_p50_s": q(platform_rows, "create_s", 0.5), "create_p99_s": q(platform_rows, "create_s", 0.99),
        "delete_p50_s": q(platform_rows, "delete_s", 0.5), "delete_p99_s": q(platform_rows, "delete_s", 0.99),
        "direct_create_p50_s": q(direct_rows, "create_s", 0.5), "direct_create_p99_s": q(direct_rows, "create_s", 0.99),
        "direct_delete_p50_s": q(direct_rows, "delete_s", 0.5), "direct_delete_p99_s": q(direct_rows, "delete_s", 0.99),
        "write_mib": mib, "guest_write_mb_s": round(guest_mbs, 1), "host_write_mb_s": round(host_mbs, 1),
        "guest_shell_round_trip_s": round(empty, 4), "log_problems": logs,
    }
    result["create_ratio_p50"] = round(result["create_p50_s"] / result["direct_create_p50_s"], 2)
    result["delete_ratio_p50"] = round(result["delete_p50_s"] / result["direct_delete_p50_s"], 2)
    result["guest_write_ratio"] = round(guest_mbs / host_mbs, 3)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="volumes created and deleted (and run directly)")
    ap.add_argument("--mib", type=int, default=256, help="MiB written in the guest and on the host")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main(args.n, args.mib))))
