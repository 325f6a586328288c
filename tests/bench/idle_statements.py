"""`python -m tests.bench.idle_statements` — not a test. What the platform costs while nothing happens: the
PostgreSQL statements each process sends per second and the CPU milliseconds each spends per second, on a
platform of its own with ``--nodes`` simulated nodes and no allocation.

Every process polls something (outbox tables, deadlines, reconcilers, leases, heartbeats): this is that floor, which
grows with the node count (each node-agent is a process) and which every figure per allocation of
``bench:saga`` includes, spread over the allocations of its measured phase. The statements are counted from
PostgreSQL's log (``log_statement = all``, by application name, as ``saga_statements``) over ``--seconds``;
``BEGIN`` and ``COMMIT`` count (each is a round trip). The CPU is read from /proc over the same window (ticks of
10 ms: below 1 ms/s per process over 20 s, a figure is a tick or two). The last line is one JSON object."""
from __future__ import annotations

import argparse
import asyncio
import time

from tests.bench.bench_saga import cpu_seconds
from tests.bench.common import report, work_dir
from tests.bench.saga_statements import counted, statements_logged
from tooling.platform import Platform


async def main(nodes: int, seconds: float, settle_s: float, top: int) -> dict:
    platform = Platform(work_dir("tessera-idle-"), env={"TESSERA_LOG_LEVEL": "WARNING"}, durable=True)
    await platform.start()
    try:
        await asyncio.gather(*(platform.add_node(f"idle-{i:03d}", "V100", 8) for i in range(nodes)))
        await asyncio.sleep(settle_s)   # the start's own work (topology reports, first reconciles) done
        async with statements_logged(platform) as logged:
            cpu0, t0 = cpu_seconds(platform), time.monotonic()
            await asyncio.sleep(seconds)
            cpu1, elapsed = cpu_seconds(platform), time.monotonic() - t0
            text = logged()
    finally:
        await platform.stop()
    per_process, per_statement = counted(text)
    cpu = {k: round((cpu1[k] - cpu0.get(k, 0)) / elapsed * 1000, 1) for k in sorted(cpu1)}
    return {"nodes": nodes, "seconds": round(elapsed, 1),
            "statements_per_s": round(sum(per_process.values()) / elapsed, 1),
            "statements_per_s_by_process": {k: round(v / elapsed, 1) for k, v in per_process.most_common()},
            "cpu_ms_per_s": round(sum(cpu.values()), 1), "cpu_ms_per_s_by_process": cpu,
            "top_statements_per_s": {k: round(v / elapsed, 2) for k, v in per_statement.most_common(top)}}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=23, help="simulated nodes (bench:saga's measured phase has 23)")
    ap.add_argument("--seconds", type=float, default=20.0, help="the window counted")
    ap.add_argument("--settle", type=float, default=8.0, help="seconds left to the start's own work first")
    ap.add_argument("--top", type=int, default=15, help="statements listed")
    args = ap.parse_args()
    report(asyncio.run(main(args.nodes, args.seconds, args.settle, args.top)), skip=("top_statements_per_s",))
