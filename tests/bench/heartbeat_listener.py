"""`python -m tests.bench.heartbeat_listener` — not a test. What one scheduler replica spends on each node's
heartbeat: the CPU of a process that listens as the scheduler does (``HealthMonitor.keep`` on a core-NATS
subscription to every node's heartbeat, as the scheduler's identity), against the same subscription with a callback
that does nothing (the baseline: nats-py's own delivery), both in the same run.

``--rate`` heartbeats a second for ``--seconds`` each, spread over ``--nodes`` nodes, each an envelope as a node-agent
sends it (``--gpus`` GPUs' metrics and as many instances). Each listener runs twice, alternating, in a process of its
own; its CPU is read from /proc from its first heartbeat to its last. The figures per heartbeat scale to a fleet:
10,000 nodes at the default 2 s are 5,000 heartbeats a second. The last line is one JSON object."""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime

import nats
import psutil

from tests.bench.common import report, work_dir
from tooling.embedded import EmbeddedNats

SUBJECT = "node_agent.evt.heartbeat"


async def listen(url: str, options: str, mode: str, total: str) -> None:
    """The listener's process: says "ready" once subscribed and "done" once ``total`` heartbeats came, then stays
    (idle) until it is killed, so that its CPU can still be read."""
    from services.scheduler.handlers.health import HealthMonitor, on_heartbeat
    from services.scheduler.settings import SchedulerSettings

    monitor, got, done = HealthMonitor(SchedulerSettings.from_env({})), 0, asyncio.Event()

    def count() -> None:
        nonlocal got
        got += 1
        if got == int(total):
            done.set()

    async def keep(msg) -> None:
        await on_heartbeat(msg, monitor=monitor)
        count()

    async def nothing(msg) -> None:
        count()

    nc = await nats.connect(url, **json.loads(options))
    await nc.subscribe(f"{SUBJECT}.*", cb=keep if mode == "keep" else nothing)
    await nc.flush()
    print("ready", flush=True)
    await done.wait()
    print("done", flush=True)
    await asyncio.Future()


def heartbeats(nodes: int, gpus: int) -> list[tuple[str, bytes]]:
    """One heartbeat per node, as its agent publishes it: (subject, envelope bytes)."""
    from services.node_agent.contracts import health as h
    from shared.envelope import Envelope

    now, out = datetime.now(UTC), []
    for _ in range(nodes):
        node = uuid.uuid4()
        metrics = [h.GpuMetrics(gpu=i, uuid=f"GPU-{uuid.uuid4()}", allocation_id=uuid.uuid4(), util_pct=55.5,
                                fb_used_mib=12345.0, temp_c=61.0, power_w=300.1) for i in range(gpus)]
        beat = h.Heartbeat(node_id=node, seq=1, sent_at=now, started_at=now, gpus=metrics,
                           instances=[m.allocation_id for m in metrics])
        envelope = Envelope(id=uuid.uuid4(), type="node_agent.heartbeat", schema_version=1, occurred_at=now,
                            correlation_id=str(node), data=beat.model_dump(mode="json"))
        out.append((f"{SUBJECT}.{node}", envelope.model_dump_json().encode()))
    return out


async def measure(server: EmbeddedNats, mode: str, beats: list[tuple[str, bytes]], rate: int,
                  seconds: float) -> dict:
    """Start a listener, send it ``rate`` heartbeats a second for ``seconds``; its CPU per heartbeat."""
    options, total = json.dumps(server.connect_options("scheduler")), int(rate * seconds)
    child = subprocess.Popen([sys.executable, "-m", "tests.bench.heartbeat_listener", "--listen", server.url,
                              options, mode, str(total)], stdout=subprocess.PIPE, text=True)
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {mode} listener did not start")
        nc = await nats.connect(server.url, **server.connect_options("admin"))
        proc, sent = psutil.Process(child.pid), 0
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
        while sent < total:   # paced: what is due by now, then until the next one is due
            due = min(total, int((time.perf_counter() - t0) * rate))
            for subject, body in beats[sent % len(beats):][:due - sent]:
                await nc.publish(subject, body)
                sent += 1
            await asyncio.sleep(max(0.0, t0 + (sent + 1) / rate - time.perf_counter()))
        await nc.flush()
        if child.stdout.readline().strip() != "done":   # blocks until the last heartbeat is handled
            raise RuntimeError(f"the {mode} listener stopped before its last heartbeat")
        cpu, wall = sum(proc.cpu_times()[:2]) - cpu0, time.perf_counter() - t0
        await nc.close()
    finally:
        child.kill()
        child.wait()
    return {"mode": mode, "heartbeats": total, "wall_s": round(wall, 2), "cpu_us_per_heartbeat": round(1e6 * cpu / total, 1)}


async def main(rate: int, seconds: float, nodes: int, gpus: int) -> dict:
    server = EmbeddedNats(work_dir("tessera-heartbeats-") / "nats").start()
    try:
        beats = heartbeats(nodes, gpus)
        runs = [await measure(server, mode, beats, rate, seconds) for mode in ("nothing", "keep") * 2]
    finally:
        server.stop()
    kept = [r["cpu_us_per_heartbeat"] for r in runs if r["mode"] == "keep"]
    bare = [r["cpu_us_per_heartbeat"] for r in runs if r["mode"] == "nothing"]
    per_beat, baseline = statistics.median(kept), statistics.median(bare)
    return {"rate_per_s": rate, "seconds": seconds, "nodes": nodes, "gpus": gpus, "heartbeat_bytes": len(beats[0][1]),
            "runs": runs, "keep_cpu_us_per_heartbeat": per_beat, "baseline_cpu_us_per_heartbeat": baseline,
            "ratio_to_baseline": round(per_beat / baseline, 2),
            "cpu_s_per_s_at_10000_nodes_every_2_s": round(per_beat * 5000 / 1e6, 3)}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--listen"]:
        asyncio.run(listen(*sys.argv[2:6]))
    else:
        ap = argparse.ArgumentParser()
        ap.add_argument("--rate", type=int, default=2500, help="heartbeats a second")
        ap.add_argument("--seconds", type=float, default=8.0, help="how long each listener is measured")
        ap.add_argument("--nodes", type=int, default=1000)
        ap.add_argument("--gpus", type=int, default=8, help="GPUs (and instances) per heartbeat")
        args = ap.parse_args()
        report(asyncio.run(main(args.rate, args.seconds, args.nodes, args.gpus)), skip=("runs",))
