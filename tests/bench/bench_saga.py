"""`./taskw bench:saga` — not a test. Drives N allocations through the gateway (sim driver, zero
latency) at a fixed concurrency and prints allocations/s and create→ACTIVE p50/p99; in the same run
measures the substrate (JetStream acknowledged publishes/s with sync_interval always and 2m,
single-row PostgreSQL transactions/s, both at the same concurrency), counts the publishes and
transactions one allocation takes, and prints the ratio of saga throughput to the ceiling they
imply, plus CPU milliseconds per allocation for every process and in all (where the time goes).

Phases, in order, on one platform (nodes are added for every allocation of every phase; none is released):
  warm-up     min(2c, n) allocations at concurrency c; the CPU each process spends on them picks the
              service py-spy samples next (``--profile busiest``, the default; ``--profile <name>`` picks one);
  measured    n allocations, closed loop at concurrency c: allocations/s R, p50/p99, messages, transactions
              and CPU per allocation, the py-spy profile;
  c1          ``--n1`` allocations one at a time: create→ACTIVE p50/p99 of an unloaded platform;
  half rate   ``--n-half`` allocations, open loop: one started every 2/R seconds whatever is in flight, each
              timed from its POST to its ``allocation.evt.activated``: p50/p99 at half the measured maximum;
  baselines   JetStream and PostgreSQL at concurrency c (then JetStream with ``sync_interval: 2m``).
The figures are checked against the targets (``targets``, ``met``). The last line is one JSON object
with every figure.

``--replicas 2`` runs two of each stateless service (``saga_effects.STATELESS``) and checks that every
allocation of the warm-up and measured phases got each of its effects exactly once (``replicas_check``)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import nats

from tests.bench import saga_effects
from tests.bench.common import family_cpu_s, js_publish_rate, log_problems, pct, pg_txn_rate, report, summarise_profile, work_dir
from tooling.client import TesseraClient
from tooling.embedded import EmbeddedNats
from tooling.platform import Platform

TENANT_ALLOCATIONS = 200   # allocations per bench tenant (its default network holds ~250 addresses)


TARGETS = {   # figure: (direction, value)
    "allocations_per_s": (">=", 40), "cpu_ms_per_allocation_total": ("<=", 40), "ratio_to_ceiling": (">=", 0.3),
    "c1_p50_ms": ("<=", 150), "half_p99_ms": ("<=", 1000),
}
NOT_SERVICES = ("nats-server", "postgres")


def cpu_seconds(platform: Platform, per_process: bool = False) -> dict[str, float]:
    """CPU seconds of every process (with its children); node-agents summed as ``node_agent`` unless
    ``per_process``."""
    out: dict[str, float] = {}
    procs = {name: p.proc.pid for name, p in platform.procs.items() if p.proc}
    if platform.nats and platform.nats.proc:
        procs["nats-server"] = platform.nats.proc.pid
    if platform.pg and platform.pg.proc:
        procs["postgres"] = platform.pg.proc.pid
    for name, pid in procs.items():
        if (spent := family_cpu_s(pid)) is not None:
            key = "node_agent" if name.startswith("node_agent:") and not per_process else name
            out[key] = out.get(key, 0.0) + spent
    return out


async def counters(platform: Platform) -> tuple[int, int]:
    """(messages in the project's streams, committed transactions in the database)."""
    nc = await nats.connect(platform.nats_url, **platform.connect_options("admin"))
    msgs = 0
    for s in await nc.jetstream().streams_info():
        if s.config.name.startswith("TESSERA_"):
            msgs += s.state.messages
    await nc.close()
    conn = await asyncpg.connect(platform.database_url)
    xacts = await conn.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    await conn.close()
    return msgs, xacts


class Outcomes:
    """Sees every allocation's ``allocation.activated`` / ``allocation.failed`` event (core subscription)."""

    def __init__(self):
        self.at: dict[str, tuple[float, str]] = {}
        self.waiters: dict[str, asyncio.Future] = {}
        self.nc = None

    async def start(self, url: str, **connect) -> Outcomes:
        """``connect``: nats.connect's credentials (``Platform.connect_options()``)."""
        self.nc = await nats.connect(url, **connect)
        await self.nc.subscribe("allocation.evt.*", cb=self._on_event)
        return self

    async def _on_event(self, msg) -> None:
        env = json.loads(msg.data)
        if env["type"] in ("allocation.activated", "allocation.failed"):
            aid = env["data"]["allocation_id"]
            self.at.setdefault(aid, (time.perf_counter(), env["type"]))
            fut = self.waiters.pop(aid, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    async def create(self, client: TesseraClient, timeout: float = 120) -> tuple[float, bool]:
        """POST one allocation and wait for its outcome: (seconds from the POST to the event, failed?)."""
        t0 = time.perf_counter()
        a = await client.create_allocation(f"bench-{uuid.uuid4().hex[:6]}", shape="vm.1gpu")
        if a["id"] not in self.at:
            fut = self.waiters[a["id"]] = asyncio.get_running_loop().create_future()
            await asyncio.wait_for(fut, timeout)
        at, kind = self.at[a["id"]]
        return at - t0, kind == "allocation.failed"

    async def close(self) -> None:
        await self.nc.close()


async def drive(platform: Platform, api_keys: list[str], n: int, concurrency: int) -> dict:
    """Closed loop: ``concurrency`` allocations in flight, the next POSTed when one is ACTIVE (worker i acts
    for tenant i mod len(api_keys))."""
    seen = await Outcomes().start(platform.nats_url, **platform.connect_options("ops"))
    latencies: list[float] = []
    failures = 0
    queue = list(range(n))
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(TesseraClient(platform.gateway_url, k)) for k in api_keys]
        for client in clients:
            await client.token()

        async def worker(client: TesseraClient):
            nonlocal failures
            while queue:
                queue.pop()
                latency, failed = await seen.create(client)
                failures += failed
                latencies.append(latency)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(clients[w % len(clients)]) for w in range(concurrency)))
        wall = time.perf_counter() - t0
    await seen.close()
    return {"wall_s": wall, "latencies": latencies, "failures": failures}


async def open_loop(platform: Platform, api_keys: list[str], n: int, rate: float) -> dict:
    """Open loop: one allocation POSTed every 1/rate seconds whatever is in flight; each timed from its POST
    to its event (the i-th for tenant i mod len(api_keys))."""
    seen = await Outcomes().start(platform.nats_url, **platform.connect_options("ops"))
    interval = 1.0 / rate
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(TesseraClient(platform.gateway_url, k)) for k in api_keys]
        for client in clients:
            await client.token()
        tasks = []
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(seen.create(clients[i % len(clients)])))
        started = time.perf_counter() - t0
        results = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    await seen.close()
    return {"wall_s": wall, "start_rate": (n - 1) / started if n > 1 and started > 0 else float("nan"),
            "latencies": [lat for lat, _ in results], "failures": sum(failed for _, failed in results)}


def busiest(before: dict[str, float], after: dict[str, float]) -> tuple[str, float]:
    """The service process (not nats-server or postgres) that spent the most CPU between two readings."""
    spent = {k: after[k] - before.get(k, 0.0) for k in after if k not in NOT_SERVICES}
    name = max(spent, key=spent.get)
    return name, spent[name]


def start_profile(platform: Platform, service: str, out: Path) -> subprocess.Popen | None:
    """py-spy (sampling, from outside the process) on one service for the measured run."""
    spy = Path(sys.executable).parent / "py-spy"
    proc = platform.procs.get(service)
    if not spy.exists() or proc is None or proc.proc is None:
        return None
    return subprocess.Popen([str(spy), "record", "--pid", str(proc.proc.pid), "--format", "raw", "--rate", "250",
                             "--nonblocking", "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def replicas_started(platform: Platform, replicas: int) -> list[str]:
    """Start ``replicas - 1`` more of each stateless service; their names in ``platform.procs``."""
    return list(await asyncio.gather(*(platform.add_replica(s, str(i)) for s in saga_effects.STATELESS
                                       for i in range(1, replicas))))


async def handled_by(platform: Platform, names: list[str]) -> dict[str, float]:
    return {name: await saga_effects.handled(platform.procs[name].port) for name in names}


async def main(n: int, concurrency: int, nodes: int, profile: str, n1: int, n_half: int, replicas: int = 1) -> dict:
    work = work_dir("tessera-bench-")
    print(f"work dir (service logs: logs/): {work}", file=sys.stderr)
    platform = Platform(work, env={"TESSERA_LOG_LEVEL": "WARNING", "TESSERA_SAGA_TENANT_INFLIGHT": "64"}, durable=True)
    phases: dict[str, float] = {}
    clock = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] = round(now - clock, 1)
        clock = now
    await platform.start()
    replicated = [*saga_effects.STATELESS, *await replicas_started(platform, replicas)] if replicas > 1 else []
    phase("platform_start")
    try:
        gpus_per_node = 16
        warmup = min(concurrency * 2, n)
        total = warmup + n + n1 + n_half            # none is released: room for every allocation of every phase
        nodes = max(nodes, -(-total // gpus_per_node))
        for i in range(nodes):
            await platform.add_node(f"bench-{i:03d}", "V100", gpus_per_node, env={"TESSERA_SIM_TOPOLOGY": "dgx2-v100-16"})
        # tenants of at most TENANT_ALLOCATIONS each: none is released, and a tenant's default network has
        # room for ~250 addresses
        keys: dict[str, list[str]] = {}
        async with platform.admin() as admin:
            for name, size in (("measured", warmup + n), ("c1", n1), ("half", n_half)):
                keys[name] = []
                for t_no in range(max(1, -(-size // TENANT_ALLOCATIONS))):
                    t = await admin.create_tenant(f"bench-{name}-{t_no}")
                    await admin.set_quota(t["id"], "shared", "V100", TENANT_ALLOCATIONS)
                    keys[name].append((await admin.create_user(t["id"], "bench", "tenant_user"))["api_key"])
        phase("nodes")
        effects = (await saga_effects.Effects().start(platform.nats_url, **platform.connect_options("admin"))
                   if replicas > 1 else None)   # it adds a subscriber of every event: only when it checks
        handled0 = await handled_by(platform, replicated)
        w0 = cpu_seconds(platform, per_process=True)
        await drive(platform, keys["measured"], warmup, concurrency)  # warm-up: connections, consumers, caches
        hottest, hottest_s = busiest(w0, cpu_seconds(platform, per_process=True))
        profiled = hottest if profile == "busiest" else profile
        phase("warmup")
        msgs0, x0 = await counters(platform)
        cpu0 = cpu_seconds(platform)
        spy = start_profile(platform, profiled, work / "profile.txt")
        run = await drive(platform, keys["measured"], n, concurrency)
        if spy:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        cpu1 = cpu_seconds(platform)
        msgs1, x1 = await counters(platform)
        phase("measured")
        handled1 = await handled_by(platform, replicated)
        replicas_check = None
        if effects is not None:
            await effects.close()
            replicas_check = await effects.check(platform.database_url, {k: handled1[k] - handled0[k] for k in handled1})
        rate = n / run["wall_s"]
        c1 = await drive(platform, keys["c1"], n1, 1) if n1 else {"latencies": [], "failures": 0}
        phase("c1")
        half = (await open_loop(platform, keys["half"], n_half, rate / 2) if n_half
                else {"latencies": [], "failures": 0, "start_rate": float("nan")})
        phase("half_rate")
        js_sync = await js_publish_rate(platform.nats_url, concurrency, 4000, **platform.connect_options())
        pg_rate = await pg_txn_rate(platform.database_url, concurrency, 4000)
    finally:
        await platform.stop()
    relaxed = EmbeddedNats(work / "nats-relaxed", sync_always=False).start()
    try:
        js_relaxed = await js_publish_rate(relaxed.url, concurrency, 4000, **relaxed.connect_options())
    finally:
        relaxed.stop()
    phase("baselines")
    lat = run["latencies"]
    pubs = (msgs1 - msgs0) / n
    txns = (x1 - x0) / n
    ceiling = min(js_sync / pubs, pg_rate / txns)
    cpu = {k: round((cpu1.get(k, 0) - cpu0.get(k, 0)) / n * 1000, 2) for k in sorted(cpu1)}
    slowest = max((k for k in cpu if k not in NOT_SERVICES), key=lambda k: cpu[k])
    def ms(values, q):
        return round(pct(values, q) * 1000, 1)
    result = {
        "allocations": n, "concurrency": concurrency, "nodes": nodes, "failed": run["failures"], "replicas": replicas,
        "allocations_per_s": round(rate, 1),
        "create_to_active_p50_ms": ms(lat, 0.50),
        "create_to_active_p99_ms": ms(lat, 0.99),
        "create_to_active_mean_ms": round(statistics.fmean(lat) * 1000, 1),
        "c1_allocations": n1, "c1_failed": c1["failures"],
        "c1_p50_ms": ms(c1["latencies"], 0.50), "c1_p99_ms": ms(c1["latencies"], 0.99),
        "half_allocations": n_half, "half_failed": half["failures"],
        "half_rate_per_s": round(rate / 2, 2), "half_start_rate_achieved_per_s": round(half["start_rate"], 2),
        "half_p50_ms": ms(half["latencies"], 0.50), "half_p99_ms": ms(half["latencies"], 0.99),
        "jetstream_publishes_per_allocation": round(pubs, 1),
        "pg_transactions_per_allocation": round(txns, 1),
        "jetstream_acked_publish_per_s_sync_always": round(js_sync),
        "jetstream_acked_publish_per_s_sync_2m": round(js_relaxed),
        "sync_always_cost_ratio": round(js_sync / js_relaxed, 3),
        "pg_single_row_txn_per_s": round(pg_rate),
        "substrate_ceiling_allocations_per_s": round(ceiling, 1),
        "ratio_to_ceiling": round(rate / ceiling, 3),
        "cpu_ms_per_allocation": cpu,
        "cpu_ms_per_allocation_total": round(sum(cpu.values()), 1),
        "slowest_service": slowest,
        "busiest_in_warmup": hottest, "busiest_in_warmup_cpu_ms_per_allocation": round(hottest_s / warmup * 1000, 1),
        "profile_of": profiled,
        "profile": summarise_profile(work / "profile.txt"),
        "service_log_lines": log_problems(list((work / "logs").glob("*.log"))),
        "phase_wall_s": phases,
    }
    if replicas_check is not None:
        result["replicas_check"] = replicas_check
    result["targets"] = {k: v for k, (_, v) in TARGETS.items()}
    result["target_direction"] = {k: op for k, (op, _) in TARGETS.items()}
    result = {k: (None if isinstance(v, float) and v != v else v) for k, v in result.items()}   # NaN: not JSON
    result["met"] = {k: result[k] is not None and (result[k] >= v if op == ">=" else result[k] <= v)
                     for k, (op, v) in TARGETS.items()}
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--n1", type=int, default=30, help="allocations of the concurrency-1 phase")
    ap.add_argument("--n-half", type=int, default=100, help="allocations of the open-loop phase at half the measured rate")
    ap.add_argument("--profile", default="busiest",
                    help="service to sample with py-spy during the measured run; 'busiest': the one with the most "
                         "CPU per allocation in the warm-up")
    ap.add_argument("--replicas", type=int, default=1,
                    help="replicas of each stateless service; >1 also checks every effect happened exactly once")
    args = ap.parse_args()
    t0 = time.perf_counter()
    result = asyncio.run(main(args.n, args.concurrency, args.nodes, args.profile, args.n1, args.n_half,
                              args.replicas))
    result["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    report(result)
