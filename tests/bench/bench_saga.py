"""`./taskw bench:saga` — not a test. Drives N allocations through the gateway (sim driver, zero
latency) at a fixed concurrency and prints allocations/s and create→ACTIVE p50/p99; in the same run
measures the substrate (JetStream acknowledged publishes/s with sync_interval always and 2m,
single-row PostgreSQL transactions/s, both at the same concurrency), counts the publishes and
transactions one allocation takes, and prints the ratio of saga throughput to the ceiling they
imply, plus CPU seconds per allocation for every process (where the time goes).
The last line is one JSON object with every figure."""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
import subprocess
import sys
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg
import nats
import psutil
from nats.js.api import StorageType, StreamConfig

from tooling.client import TesseraClient
from tooling.embedded import EmbeddedNats
from tooling.platform import Platform


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else float("nan")


async def js_publish_rate(url: str, concurrency: int, total: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    name = f"BENCH_{uuid.uuid4().hex[:8].upper()}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"], storage=StorageType.FILE))
    payload = b"x" * 600     # about one envelope
    per = total // concurrency

    async def worker(w: int):
        for i in range(per):
            await js.publish(f"{name.lower()}.{w}", payload, headers={"Nats-Msg-Id": f"{w}-{i}"})
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    rate = per * concurrency / (time.perf_counter() - t0)
    await js.delete_stream(name)
    await nc.close()
    return rate


async def pg_txn_rate(dsn: str, concurrency: int, total: int) -> float:
    pool = await asyncpg.create_pool(dsn, min_size=concurrency, max_size=concurrency)
    table = f"bench_{uuid.uuid4().hex[:8]}"
    await pool.execute(f"CREATE TABLE {table} (id uuid PRIMARY KEY, v int)")
    per = total // concurrency

    async def worker():
        for i in range(per):
            async with pool.acquire() as c, c.transaction():
                await c.execute(f"INSERT INTO {table} VALUES ($1, $2)", uuid.uuid4(), i)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    rate = per * concurrency / (time.perf_counter() - t0)
    await pool.execute(f"DROP TABLE {table}")
    await pool.close()
    return rate


def cpu_seconds(platform: Platform) -> dict[str, float]:
    out: dict[str, float] = {}
    procs = {name: p.proc.pid for name, p in platform.procs.items() if p.proc}
    if platform.nats and platform.nats.proc:
        procs["nats-server"] = platform.nats.proc.pid
    if platform.pg and platform.pg.proc:
        procs["postgres"] = platform.pg.proc.pid
    for name, pid in procs.items():
        try:
            proc = psutil.Process(pid)
            family = [proc, *proc.children(recursive=True)]
            key = "node_agent" if name.startswith("node_agent:") else name
            out[key] = out.get(key, 0.0) + sum(p.cpu_times().user + p.cpu_times().system for p in family)
        except psutil.NoSuchProcess:
            pass
    return out


async def counters(platform: Platform) -> tuple[int, int]:
    """(messages in the project's streams, committed transactions in the database)."""
    nc = await nats.connect(platform.nats_url)
    msgs = 0
    for s in await nc.jetstream().streams_info():
        if s.config.name.startswith("TESSERA_"):
            msgs += s.state.messages
    await nc.close()
    conn = await asyncpg.connect(platform.database_url)
    xacts = await conn.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    await conn.close()
    return msgs, xacts


async def drive(platform: Platform, api_key: str, n: int, concurrency: int) -> dict:
    nc = await nats.connect(platform.nats_url)
    activated: dict[str, float] = {}
    waiters: dict[str, asyncio.Future] = {}

    async def on_event(msg):
        env = json.loads(msg.data)
        if env["type"] in ("allocation.activated", "allocation.failed"):
            aid = env["data"]["allocation_id"]
            activated[aid] = time.perf_counter()
            if aid in waiters and not waiters[aid].done():
                waiters[aid].set_result(env["type"])
    await nc.subscribe("allocation.evt.*", cb=on_event)
    latencies: list[float] = []
    failures = 0
    queue = list(range(n))
    async with TesseraClient(platform.gateway_url, api_key) as client:
        await client.token()

        async def worker():
            nonlocal failures
            while queue:
                queue.pop()
                t0 = time.perf_counter()
                a = await client.create_allocation(f"bench-{uuid.uuid4().hex[:6]}", shape="vm.1gpu")
                fut = asyncio.get_running_loop().create_future()
                waiters[a["id"]] = fut
                if a["id"] in activated:
                    fut.set_result("seen")
                outcome = await asyncio.wait_for(fut, 120)
                if outcome == "allocation.failed":
                    failures += 1
                latencies.append(activated[a["id"]] - t0)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    await nc.close()
    return {"wall_s": wall, "latencies": latencies, "failures": failures}


def start_profile(platform: Platform, service: str, out: Path) -> subprocess.Popen | None:
    """py-spy (sampling, from outside the process) on one service for the measured run."""
    spy = Path(sys.executable).parent / "py-spy"
    proc = platform.procs.get(service)
    if not spy.exists() or proc is None or proc.proc is None:
        return None
    return subprocess.Popen([str(spy), "record", "--pid", str(proc.proc.pid), "--format", "raw", "--rate", "250",
                             "--nonblocking", "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarise_profile(path: Path, top: int = 12) -> dict:
    """Share of samples per function: self (leaf frame) and inclusive (anywhere on the stack, our code only)."""
    if not path.exists():
        return {}
    self_t: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        self_t[frames[-1]] += n
        for f in set(frames):
            if "__main__.py" not in f and ("services/" in f or "shared/" in f):
                incl[f] += n
    if not total:
        return {}
    pct_of = lambda c: {k.replace(str(Path(__file__).resolve().parents[2]) + "/", ""): round(100 * v / total, 1)
                        for k, v in c.most_common(top)}
    return {"samples": total, "self_pct": pct_of(self_t), "inclusive_pct_project_code": pct_of(incl)}


async def main(n: int, concurrency: int, nodes: int, profile: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    platform = Platform(work, env={"TESSERA_LOG_LEVEL": "WARNING"}, durable=True)
    await platform.start()
    try:
        gpus_per_node = 16
        warmup = min(concurrency * 2, n)
        nodes = max(nodes, -(-(n + warmup) // gpus_per_node))   # room for the warm-up and the measured run
        for i in range(nodes):
            await platform.add_node(f"bench-{i:03d}", "V100", gpus_per_node, env={"TESSERA_SIM_TOPOLOGY": "dgx2-v100-16"})
        async with platform.admin() as admin:
            t = await admin.create_tenant("bench")
            await admin.set_quota(t["id"], "shared", "V100", n + warmup)
            u = await admin.create_user(t["id"], "bench", "tenant_user")
        await drive(platform, u["api_key"], warmup, concurrency)  # warm-up: connections, consumers, caches
        msgs0, x0 = await counters(platform)
        cpu0 = cpu_seconds(platform)
        spy = start_profile(platform, profile, work / "profile.txt")
        run = await drive(platform, u["api_key"], n, concurrency)
        if spy:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        cpu1 = cpu_seconds(platform)
        msgs1, x1 = await counters(platform)
        js_sync = await js_publish_rate(platform.nats_url, concurrency, 4000)
        pg_rate = await pg_txn_rate(platform.database_url, concurrency, 4000)
    finally:
        await platform.stop()
    relaxed = EmbeddedNats(work / "nats-relaxed", sync_always=False).start()
    try:
        js_relaxed = await js_publish_rate(relaxed.url, concurrency, 4000)
    finally:
        relaxed.stop()
    lat = run["latencies"]
    rate = n / run["wall_s"]
    pubs = (msgs1 - msgs0) / n
    txns = (x1 - x0) / n
    ceiling = min(js_sync / pubs, pg_rate / txns)
    cpu = {k: round((cpu1.get(k, 0) - cpu0.get(k, 0)) / n * 1000, 2) for k in sorted(cpu1)}
    slowest = max((k for k in cpu if k not in ("nats-server", "postgres")), key=lambda k: cpu[k])
    return {
        "allocations": n, "concurrency": concurrency, "nodes": nodes, "failed": run["failures"],
        "allocations_per_s": round(rate, 1),
        "create_to_active_p50_ms": round(pct(lat, 0.50) * 1000, 1),
        "create_to_active_p99_ms": round(pct(lat, 0.99) * 1000, 1),
        "create_to_active_mean_ms": round(statistics.fmean(lat) * 1000, 1),
        "jetstream_publishes_per_allocation": round(pubs, 1),
        "pg_transactions_per_allocation": round(txns, 1),
        "jetstream_acked_publish_per_s_sync_always": round(js_sync),
        "jetstream_acked_publish_per_s_sync_2m": round(js_relaxed),
        "sync_always_cost_ratio": round(js_sync / js_relaxed, 3),
        "pg_single_row_txn_per_s": round(pg_rate),
        "substrate_ceiling_allocations_per_s": round(ceiling, 1),
        "ratio_to_ceiling": round(rate / ceiling, 3),
        "cpu_ms_per_allocation": cpu,
        "slowest_service": slowest,
        "profile_of": profile,
        "profile": summarise_profile(work / "profile.txt"),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--profile", default="saga", help="service to sample with py-spy during the run")
    args = ap.parse_args()
    result = asyncio.run(main(args.n, args.concurrency, args.nodes, args.profile))
    for k, v in result.items():
        print(f"{k:45s} {v}")
    print(json.dumps(result))
