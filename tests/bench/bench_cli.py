"""`./taskw bench:cli` — not a test. How fast the `tessera` command answers, against what a bare Python
costs on the same machine in the same run.

1. Cold start: ``tessera --help`` (``python -m cli --help``, a fresh process each time) ``--runs`` times,
   interleaved with ``python -c pass`` and ``python -S -c pass``: p50/p95 of each and the ratios
   (target: p95 ≤ 300 ms).
2. A read through the API: a platform (sim nodes) with one tenant holding ``--allocations`` allocations;
   ``tessera alloc list`` in a logged-in context (its cached token: one request) and with only
   TESSERA_URL/TESSERA_API_KEY (a token exchange each time), against a fresh ``python -c`` that sends the same
   ``GET /v1/allocations`` with urllib (target: p95 ≤ 500 ms).
Each figure in wall milliseconds and, as ``<name>_cpu``, the CPU milliseconds of the process (what other work on
a shared machine changes least); the 1-minute load average says how shared it was.
The last line of output is one JSON object."""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.common import pct, report, work_dir
from tooling.platform import Platform

REPO = Path(__file__).resolve().parents[2]
HELP_TARGET_S, LIST_TARGET_S = 0.300, 0.500
RAW_GET = ("import json, os, urllib.request\n"
           "r = urllib.request.Request(os.environ['URL'] + '/v1/allocations?limit=100',"
           " headers={'Authorization': 'Bearer ' + os.environ['TOKEN']})\n"
           "json.load(urllib.request.urlopen(r))\n")


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """Wall seconds of one run, and the CPU seconds (user + system) the process spent: the figure a machine
    shared with other work changes least."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def series(commands: dict[str, tuple[list[str], dict]], runs: int) -> dict[str, list[float]]:
    """Each command ``runs`` times, interleaved (so a busy moment of the machine falls on all of them): wall
    seconds under its name, CPU seconds under ``<name>_cpu``."""
    out: dict[str, list[float]] = {}
    for _ in range(runs):
        for name, (cmd, env) in commands.items():
            wall, cpu = timed(cmd, env)
            out.setdefault(name, []).append(wall)
            out.setdefault(f"{name}_cpu", []).append(cpu)
    return out


def summary(values: dict[str, list[float]]) -> dict:
    return {f"{name}_{q}_ms": round(pct(v, p) * 1000, 1) for name, v in values.items()
            for q, p in (("p50", 0.5), ("p95", 0.95))}


def cold_help(runs: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    py = sys.executable
    s = series({"help": ([py, "-m", "cli", "--help"], env), "python": ([py, "-c", "pass"], env),
                "python_S": ([py, "-S", "-c", "pass"], env)}, runs)
    r = summary(s)
    r["help_p95_over_python_p95"] = round(r["help_p95_ms"] / r["python_p95_ms"], 2)
    r["help_p50_over_python_p50"] = round(r["help_p50_ms"] / r["python_p50_ms"], 2)
    r["load_average_1m"] = os.getloadavg()[0]
    r["help_target_ms"] = HELP_TARGET_S * 1000
    r["help_target_met"] = r["help_p95_ms"] <= HELP_TARGET_S * 1000
    return r


async def alloc_list(runs: int, allocations: int) -> dict:
    work = work_dir("tessera-bench-cli-")
    print(f"work dir (service logs: logs/): {work}", file=sys.stderr)
    platform = Platform(work, env={"TESSERA_LOG_LEVEL": "WARNING"}, durable=False)
    await platform.start()
    try:
        await platform.add_node("bench-cli-0", "H100", 8)
        async with platform.admin() as admin:
            t = await admin.create_tenant("bench-cli")
            await admin.set_quota(t["id"], "shared", "H100", 64)
            key = (await admin.create_user(t["id"], "bench", "tenant_user"))["api_key"]
        from tooling.client import TesseraClient
        async with TesseraClient(platform.gateway_url, key) as c:
            for i in range(allocations):
                await c.create_allocation(f"bench-{i}", shape="vm.1gpu", fail_fast=True)
            token = await c.token()
        return await asyncio.to_thread(_measure_list, platform.gateway_url, key, token, runs, work)
    finally:
        await platform.stop()


def _measure_list(url: str, key: str, token: str, runs: int, work: Path) -> dict:
    py = sys.executable
    base = {**os.environ, "PYTHONPATH": str(REPO), "TESSERA_CONFIG": str(work / "cli" / "config.json")}
    for k in ("TESSERA_URL", "TESSERA_API_KEY"):
        base.pop(k, None)
    subprocess.run([py, "-m", "cli", "login", url, "--api-key", key], env=base, cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    env_only = {**base, "TESSERA_URL": url, "TESSERA_API_KEY": key}
    s = series({"list": ([py, "-m", "cli", "alloc", "list"], base),
                "list_env_key": ([py, "-m", "cli", "alloc", "list"], env_only),
                "raw_get": ([py, "-c", RAW_GET], {**base, "URL": url, "TOKEN": token})}, runs)
    r = summary(s)
    r["list_p95_over_raw_get_p95"] = round(r["list_p95_ms"] / r["raw_get_p95_ms"], 2)
    r["list_p50_over_raw_get_p50"] = round(r["list_p50_ms"] / r["raw_get_p50_ms"], 2)
    r["list_target_ms"] = LIST_TARGET_S * 1000
    r["list_target_met"] = r["list_p95_ms"] <= LIST_TARGET_S * 1000
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30, help="cold starts of each command")
    ap.add_argument("--allocations", type=int, default=20, help="allocations the listed tenant holds")
    ap.add_argument("--no-platform", action="store_true", help="only the cold --help")
    args = ap.parse_args()
    t0 = time.perf_counter()
    result = cold_help(args.runs)
    if not args.no_platform:
        result.update(asyncio.run(alloc_list(args.runs, args.allocations)))
    result["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    report(result)


if __name__ == "__main__":
    main()
