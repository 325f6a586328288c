"""`./taskw bench:noisy` — not a test. The noisy neighbour: does one tenant's flood delay another tenant's
allocations?

One durable platform (as bench:saga: sim nodes at zero latency, PostgreSQL with fsync, JetStream with
``sync_interval: always``), two tenants:
  B, the quiet one, creates ``vm.1gpu`` allocations at a steady rate (open loop: one POST every 1/rate s,
    whatever is in flight), each timed from its POST to its ``allocation.evt.activated`` (a core NATS
    subscription, as bench:saga), then released;
  A, the noisy one, floods the API from ``--flood-procs`` processes of ``--flood-c`` clients each, as fast as
    they go: POST an allocation (``fail_fast``), then GET it (or, when the POST was refused, list its
    allocations), again and again.
The tenants' GPUs are apart, so the flood is control-plane work and never capacity taken from B: B's
allocations go to the pool ``quiet`` (``--nodes`` nodes of 16 V100), A's to ``shared`` (one such node) with a
quota far above it, so every request A sends is accepted and runs its saga; once A's node is full its
reservations fail at once (``fail_fast``: no capacity) instead of waiting in the scheduler's queue.
Phases, in order: warm-up (a few of B's); ``alone``: B for ``--seconds``; ``flood``: A's processes start, and
once they answer, B's same schedule again; then A stops. In the same run: B's p50/p99 alone and under the
flood and their ratios (target ≤ 1.5), A's requests per second, every status they got and the share answered
429 (0 when the gateway limits nothing), A's allocations accepted, the requests left waiting in A's saga
line when the flood stops, and the CPU seconds of every process per phase. The last line is one JSON object.

The flood runs in processes of its own (this module with ``--flood``): in the measuring process it would
delay B's timings by its own event-loop work. They run at ``--flood-nice`` (19 by default): a flood comes from
other machines, and here the generator would otherwise take a core of the two the whole platform shares.
``--bound`` sets TESSERA_SAGA_TENANT_INFLIGHT for the run
(unset: the coordinator's default), e.g. ``--bound 100000`` to see the flood without the tenant's line;
``--b-weight N`` has the provider give B the weight N (each service's consumers then serve N of B's messages for
one of A's while both wait, shared.fairness). Besides the ratios of B's whole create → ACTIVE, the JSON has those
of its two parts: the POST's answer (the gateway) and 202 → ACTIVE (the services, whose consumers serve the
tenants fairly); ``target`` and ``meets_target`` are the work item's figure, B's p99 ratio.

Where B's 202 → ACTIVE went (``b_tail``, read from the services' outboxes and inboxes and the streams once both
phases ran: ``common.tail_of``): per part and service, the mean ms per allocation alone, under the flood and
over the flood's five slowest (``publish@saga``: from the coordinator's handler writing a command to the
stream storing it), and those five with the three segments furthest above their quiet p50. Beside the CPU
seconds, ``runqueue_s_*`` says how long each process waited for a core while it could run: when that grows
with the flood, the tail is the machine's two cores shared, not a queue of A's messages ahead of B's.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import nats

from tests.bench.bench_saga import cpu_seconds
from tests.bench.common import family_runqueue_s, log_problems, pct, report, tail_of, work_dir
from tests.support.polling import eventually
from tooling.client import ApiError, TesseraClient
from tooling.platform import Platform

TARGET_RATIO = 1.5


# --- tenant A: the flood (a process of its own) -----------------------------------------------------------

async def flood(url: str, api_key: str, concurrency: int) -> dict:
    """Run ``concurrency`` clients of one tenant as fast as they go until SIGTERM; print ``FLOOD_READY`` once
    the first answers came. Returns the statuses counted per request kind."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    statuses: dict[str, collections.Counter] = {"create": collections.Counter(), "read": collections.Counter()}
    ready = asyncio.Event()

    async def call(client: TesseraClient, kind: str, method: str, path: str, body=None):
        try:
            status, doc, _ = await client.request(method, path, json_body=body, expect=(200, 201, 202))
        except ApiError as exc:
            status, doc = exc.status, None
        except Exception as exc:   # a refused or dropped connection counts too: the generator pushed that hard
            status, doc = type(exc).__name__, None
        statuses[kind][str(status)] += 1
        return doc

    async def client_loop(client: TesseraClient):
        while not stop.is_set():
            created = await call(client, "create", "POST", "/v1/allocations",
                                 {"name": f"flood-{uuid.uuid4().hex[:6]}", "shape": "vm.1gpu", "volume_gb": 0,
                                  "labels": {}, "fail_fast": True})
            if created and created.get("id"):
                await call(client, "read", "GET", f"/v1/allocations/{created['id']}")
            else:
                await call(client, "read", "GET", "/v1/allocations?limit=20")
            ready.set()

    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(TesseraClient(url, api_key)) for _ in range(concurrency)]
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(client_loop(c)) for c in clients]
        await ready.wait()
        print("FLOOD_READY", flush=True)
        await stop.wait()
        wall = time.perf_counter() - t0
        await asyncio.gather(*tasks)
    return {"wall_s": wall, "statuses": {k: dict(v) for k, v in statuses.items()}}


class Flood:
    """A's flood processes, started and stopped from the measuring process."""

    def __init__(self, url: str, api_key: str, procs: int, concurrency: int, nice: int = 0):
        self.args = [sys.executable, "-m", "tests.bench.bench_noisy", "--flood", url, api_key, str(concurrency)]
        self.n, self.nice = procs, nice
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        nice = (lambda: os.nice(self.nice)) if self.nice else None
        for _ in range(self.n):
            self.procs.append(await asyncio.create_subprocess_exec(*self.args, stdout=asyncio.subprocess.PIPE, env=env,
                                                                   preexec_fn=nice))
        for p in self.procs:
            line = await asyncio.wait_for(p.stdout.readline(), 60)
            if b"FLOOD_READY" not in line:
                raise RuntimeError(f"a flood process did not start: {line!r}")

    async def stop(self) -> dict:
        """Stop every process and sum what they counted: requests, wall time, statuses."""
        for p in self.procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        totals: dict[str, collections.Counter] = {"create": collections.Counter(), "read": collections.Counter()}
        wall = 0.0
        for p in self.procs:
            try:
                out, _ = await asyncio.wait_for(p.communicate(), 60)
            except TimeoutError:
                p.kill()
                raise
            lines = out.decode().strip().splitlines()
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"a flood process ended with {p.returncode}: {lines[-3:]}")
            doc = json.loads(lines[-1])
            wall = max(wall, doc["wall_s"])
            for kind, counts in doc["statuses"].items():
                totals[kind].update(counts)
        return {"wall_s": wall, "statuses": {k: dict(v) for k, v in totals.items()}}


# --- tenant B: the steady tenant, measured --------------------------------------------------------------

class Activations:
    """Sees ``allocation.activated`` / ``allocation.failed`` of every allocation (a core subscription)."""

    def __init__(self):
        self.at: dict[str, tuple[float, str]] = {}
        self.waiters: dict[str, asyncio.Future] = {}

    async def start(self, url: str, **connect) -> Activations:
        self.nc = await nats.connect(url, **connect)
        for subject in ("allocation.evt.activated", "allocation.evt.failed"):
            await self.nc.subscribe(subject, cb=self._on_event)
        return self

    async def _on_event(self, msg) -> None:
        env = json.loads(msg.data)
        aid = env["data"]["allocation_id"]
        self.at.setdefault(aid, (time.perf_counter(), env["type"]))
        fut = self.waiters.pop(aid, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def until(self, allocation_id: str, timeout: float) -> tuple[float, str]:
        if allocation_id not in self.at:
            fut = self.waiters[allocation_id] = asyncio.get_running_loop().create_future()
            await asyncio.wait_for(fut, timeout)
        return self.at[allocation_id]

    async def close(self) -> None:
        await self.nc.close()


async def steady(client: TesseraClient, seen: Activations, rate: float, seconds: float) -> dict:
    """B's open loop: one allocation POSTed every 1/rate s for ``seconds``; each timed POST → ACTIVE, split
    at the 202 (the gateway's part; the rest is the saga's and its participants'), then released once the
    gateway shows it ACTIVE."""
    n = max(1, int(rate * seconds))
    wall = time.time() - time.perf_counter()   # the services' clock (epoch s) of a perf_counter instant

    async def release(allocation_id: str) -> None:
        """Released after it was timed, asked again each second while B's own rate limit refuses (a machine busy
        with other work bunches B's releases): a refusal there is no figure of the benchmark's."""
        async def released() -> bool:
            try:
                await client.release(allocation_id)
                return True
            except ApiError as exc:
                if exc.status != 429:
                    raise
                return False
        await eventually(released, timeout=120, interval=1.0, what=f"the release of {allocation_id} to be accepted")

    async def one() -> tuple[float, float, bool, tuple]:
        t0 = time.perf_counter()
        a = await client.create_allocation(f"steady-{uuid.uuid4().hex[:6]}", shape="vm.1gpu", pool="quiet")
        posted = time.perf_counter() - t0
        at, kind = await seen.until(a["id"], 120)
        if kind == "allocation.activated":
            await client.wait_state(a["id"], "ACTIVE", timeout=60)
            await release(a["id"])
        return at - t0, posted, kind != "allocation.activated", (a["id"], wall + t0 + posted, wall + at)

    tasks = []
    t0 = time.perf_counter()
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    results = await asyncio.gather(*tasks)
    def ms(values, q):
        return round(pct(values, q) * 1000, 1)
    latencies, posts = [r[0] for r in results], [r[1] for r in results]
    to_active = [lat - post for lat, post in zip(latencies, posts)]
    return {"n": n, "failed": sum(r[2] for r in results), "p50_ms": ms(latencies, 0.5), "p95_ms": ms(latencies, 0.95),
            "p99_ms": ms(latencies, 0.99), "post_p50_ms": ms(posts, 0.5), "post_p99_ms": ms(posts, 0.99),
            "accepted_to_active_p50_ms": ms(to_active, 0.5), "accepted_to_active_p99_ms": ms(to_active, 0.99),
            "samples": [r[3] for r in results if not r[2]]}   # (id, 202 and ACTIVE seen, epoch s): see ``common.tail_of``


class LineWatch:
    """Samples A's saga line every ``every`` s (the saga's schema): the most sagas in flight and waiting seen,
    which say whether the line held A back at all."""

    def __init__(self, platform: Platform, tenant_id: str, every: float = 0.25):
        self.platform, self.tenant_id, self.every = platform, uuid.UUID(tenant_id), every
        self.max_in_flight = self.max_waiting = self.waiting = 0

    async def sample(self, conn: asyncpg.Connection) -> None:
        in_flight, self.waiting = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM saga.sagas WHERE tenant_id=$1 AND kind='allocate' "
            "AND status IN ('running', 'compensating')), (SELECT count(*) FROM saga.saga_waiting WHERE tenant_id=$1)",
            self.tenant_id)
        self.max_in_flight, self.max_waiting = max(self.max_in_flight, in_flight), max(self.max_waiting, self.waiting)

    async def run(self) -> None:
        conn = await asyncpg.connect(self.platform.database_url)
        try:
            while True:
                await self.sample(conn)
                await asyncio.sleep(self.every)
        finally:
            await conn.close()


def runqueue_seconds(platform: Platform) -> dict[str, float]:
    """``common.family_runqueue_s`` of every process, as ``cpu_seconds`` names them (node-agents summed)."""
    procs = [(name.partition(":")[0], p.proc.pid) for name, p in platform.procs.items() if p.proc]
    procs += [(name, s.proc.pid) for name, s in (("nats-server", platform.nats), ("postgres", platform.pg)) if s and s.proc]
    out: dict[str, float] = collections.Counter()
    for name, pid in procs:
        out[name] += family_runqueue_s(pid) or 0.0
    return out


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 1) for k in sorted(after)}


async def main(args) -> dict:
    work = work_dir("tessera-bench-noisy-")
    print(f"work dir (service logs: logs/): {work}", file=sys.stderr)
    env = {"TESSERA_LOG_LEVEL": "WARNING"}
    if args.write_per_s:       # the rate limits a provider sizes to its control plane (both tenants alike)
        for scope in ("TENANT", "USER"):
            env.update({f"TESSERA_RATE_{scope}_WRITE_PER_S": str(args.write_per_s),
                        f"TESSERA_RATE_{scope}_WRITE_BURST": str(2 * args.write_per_s),
                        f"TESSERA_RATE_{scope}_READ_PER_S": str(args.read_per_s),
                        f"TESSERA_RATE_{scope}_READ_BURST": str(2 * args.read_per_s)})
    if args.bound:
        env["TESSERA_SAGA_TENANT_INFLIGHT"] = str(args.bound)
    platform = Platform(work, env=env, durable=True)
    await platform.start()
    result: dict = {"bound": args.bound or "default", "b_rate_per_s": args.rate, "phase_s": args.seconds,
                    "rate_limits": {"write_per_s": args.write_per_s, "read_per_s": args.read_per_s}
                    if args.write_per_s else "defaults",
                    "flood_processes": args.flood_procs, "flood_clients_per_process": args.flood_c,
                    "flood_nice": args.flood_nice, "a_write_per_s": args.a_write_per_s or "as every tenant",
                    "b_weight": args.b_weight}
    try:
        async with platform.admin() as admin:
            await admin.define_pool("quiet")
        for i, pool in enumerate(["shared"] + ["quiet"] * args.nodes):
            await platform.add_node(f"noisy-{i:02d}", "V100", 16, pool=pool, env={"TESSERA_SIM_TOPOLOGY": "dgx2-v100-16"})
        async with platform.admin() as admin:
            keys, tenants = {}, {}
            for name, pool, quota in (("a", "shared", 1_000_000), ("b", "quiet", 16 * args.nodes)):
                t = await admin.create_tenant(f"noisy-{name}")
                await admin.set_quota(t["id"], pool, "V100", quota)
                tenants[name] = t["id"]
                keys[name] = (await admin.create_user(t["id"], "bench", "tenant_user"))["api_key"]
            if args.b_weight > 1:    # the provider gives B's plan a larger share of every service's work
                await admin.request("PATCH", f"/v1/tenants/{tenants['b']}", json_body={"weight": args.b_weight})
            if args.a_write_per_s:   # the provider narrows the noisy tenant's writes (an override, as an operator would)
                w = args.a_write_per_s
                await admin.request("PUT", f"/v1/tenants/{tenants['a']}/rate-limits",
                                    json_body={"write_per_s": w, "write_burst": 2 * w, "user_write_per_s": w,
                                               "user_write_burst": 2 * w})
        seen = await Activations().start(platform.nats_url, **platform.connect_options("ops"))   # read-only
        async with TesseraClient(platform.gateway_url, keys["b"]) as b:
            await steady(b, seen, rate=4, seconds=1)                   # warm-up: connections, consumers, caches
            c0, w0 = cpu_seconds(platform), runqueue_seconds(platform)
            alone = await steady(b, seen, args.rate, args.seconds)
            c1, w1, load = cpu_seconds(platform), runqueue_seconds(platform), [os.getloadavg()[0]]
            a = Flood(platform.gateway_url, keys["a"], args.flood_procs, args.flood_c, args.flood_nice)
            line = LineWatch(platform, tenants["a"])
            watching = asyncio.create_task(line.run())
            try:
                await a.start()
                c2, w2 = cpu_seconds(platform), runqueue_seconds(platform)
                flooded = await steady(b, seen, args.rate, args.seconds)
            finally:
                counted = await a.stop()
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching
            c3, w3 = cpu_seconds(platform), runqueue_seconds(platform)
            load.append(os.getloadavg()[0])
        await seen.close()
        where = await tail_of(platform, alone.pop("samples"), flooded.pop("samples"), "allocation.activated")
    finally:
        await platform.stop()
    statuses = counted["statuses"]
    requests = sum(sum(v.values()) for v in statuses.values())
    refused = sum(v.get("429", 0) for v in statuses.values())
    def ratio(k):
        return round(flooded[k] / alone[k], 2) if alone[k] else None
    result.update({
        "b_alone": alone, "b_flood": flooded,
        "b_p50_alone_ms": alone["p50_ms"], "b_p99_alone_ms": alone["p99_ms"],
        "b_p50_flood_ms": flooded["p50_ms"], "b_p99_flood_ms": flooded["p99_ms"],
        "b_accepted_to_active_p50_ms": [alone["accepted_to_active_p50_ms"], flooded["accepted_to_active_p50_ms"]],
        "b_accepted_to_active_p99_ms": [alone["accepted_to_active_p99_ms"], flooded["accepted_to_active_p99_ms"]],
        "ratio_p50": ratio("p50_ms"), "ratio_p99": ratio("p99_ms"), "target_ratio": TARGET_RATIO,
        # steadier than the p99, which a phase's one or two slowest allocations set: a reading aid, not the target
        "ratio_p95": ratio("p95_ms"),
        # the services' part alone (202 to ACTIVE), which their consumers' fair service bears on; the rest is the
        # gateway's answer to the POST
        "ratio_accepted_to_active_p50": ratio("accepted_to_active_p50_ms"),
        "ratio_accepted_to_active_p99": ratio("accepted_to_active_p99_ms"),
        "ratio_post_p99": ratio("post_p99_ms"),
        "a_requests": requests, "a_requests_per_s": round(requests / counted["wall_s"], 1),
        "a_statuses": statuses, "a_429_share": round(refused / requests, 4) if requests else 0.0,
        "a_allocations_accepted": statuses["create"].get("202", 0),
        "a_sagas_in_flight_max": line.max_in_flight, "a_waiting_in_saga_line_max": line.max_waiting,
        "a_waiting_in_saga_line_at_end": line.waiting,
        "b_tail": where,
        "cpu_s_alone": spent(c0, c1), "cpu_s_flood": spent(c2, c3),
        # seconds each waited for a core while runnable: grows with the machine's load, not the process's work
        "runqueue_s_alone": spent(w0, w1), "runqueue_s_flood": spent(w2, w3),
        "load_avg_1m_end_alone_flood": [round(x, 2) for x in load],   # others' work on the machine shows here
        "service_log_lines": log_problems(list((work / "logs").glob("*.log"))),
    })
    result["met"] = {k: result[k] is not None and result[k] <= TARGET_RATIO for k in ("ratio_p50", "ratio_p99")}
    # the work item's figure: B's p99 under the flood over its p99 alone, in this run
    result["target"] = {"ratio_p99": TARGET_RATIO}
    result["meets_target"] = result["met"]["ratio_p99"]
    return result


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--flood":
        print(json.dumps(asyncio.run(flood(sys.argv[2], sys.argv[3], int(sys.argv[4])))))
        sys.exit(0)
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=2.0, help="B's allocations per second")
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="length of each phase (at --rate 2, 120 allocations: a p99 of the 2nd slowest, not the slowest)")
    ap.add_argument("--flood-procs", type=int, default=2, help="A's load-generating processes")
    ap.add_argument("--flood-c", type=int, default=8, help="A's concurrent clients per process")
    ap.add_argument("--a-write-per-s", type=int, default=0,
                    help="A's writes/s alone, set by a provider override (burst twice that); 0: as every tenant")
    ap.add_argument("--b-weight", type=int, default=1,
                    help="B's weight, set by the provider (PATCH /v1/tenants/{id}); A keeps 1, the default")
    ap.add_argument("--flood-nice", type=int, default=19,
                    help="niceness of A's processes: 19 (the default) lets the generator take only the CPU the "
                         "platform leaves, as if it ran on machines of its own (this machine has two cores for "
                         "everything); 0 lets it compete with the platform")
    ap.add_argument("--nodes", type=int, default=2, help="B's sim nodes of 16 V100 each (A has one of its own)")
    ap.add_argument("--bound", type=int, default=0, help="TESSERA_SAGA_TENANT_INFLIGHT for the run (0: default)")
    ap.add_argument("--write-per-s", type=int, default=5,
                    help="every tenant's and user's writes/s (burst twice that); 0: the gateway's defaults")
    ap.add_argument("--read-per-s", type=int, default=20, help="every tenant's and user's reads/s (burst twice that)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    out = asyncio.run(main(args))
    out["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    report(out)
