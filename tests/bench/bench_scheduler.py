"""`./taskw bench:scheduler` — not a test. The scheduler at 10,000-node scale, in-process and as a service.

(a) in-process: the placement engine and the domain Scheduler at 1,000 and 10,000 nodes
    (tests/bench/bench_scheduler_engine.py): decisions/s, p50/p99, memory, cost growth;
(b) through the running service (its own process, embedded NATS JetStream + PostgreSQL): an inventory
    of N nodes x 8 GPUs (mixed H100/A100, pools shared and spot) and T tenants with quotas, inserted
    with COPY; then a stream of ``scheduler.reserve_slots`` commands (1/2/4/8-GPU slices, a share of them
    released again) kept at a fixed concurrency, timing command published → ``slots_reserved`` seen; a share
    of the stream (``--gang-share``, 10%) are ``scheduler.reserve_gang`` commands of 2-8 members (placed all
    or nothing, timed to ``gang_placed``/``gang_rejected``; a placed gang's members released together).
    In the same run, the substrate: acknowledged JetStream publishes/s and single-row PostgreSQL
    transactions/s at that concurrency, the ratios to them, CPU ms per decision per process, and the
    transactions and publishes one decision costs (where the time goes).
The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import asyncpg
import nats

from services.node_agent.adapters.discovery.sim import sim_topology
from services.scheduler.domain.topology import derive_slot_map
from shared.db import migrate
from shared.envelope import Envelope, utcnow
from tests.bench.common import (
    cpu_of,
    js_publish_rate,
    pct,
    pg_txn_rate,
    provisioned_dsn,
    report,
    summarise_profile,
    work_dir,
    xacts,
)
from tests.support.polling import eventually
from tooling.embedded import EmbeddedNats, EmbeddedPostgres

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [("vm.1gpu", 1, 0.4), ("vm.2gpu", 2, 0.3), ("vm.4gpu", 4, 0.2), ("vm.8gpu", 8, 0.1)]
KINDS = {"H100": "hgx-h100-8", "A100": "hgx-a100-8"}
POOLS = ("shared", "spot")
TARGET = {"decisions_per_s": 600, "p99_ms": 250}    # through the service, at 10,000 nodes


def slot_templates() -> dict[str, list[dict]]:
    """One derived slot map per hardware kind; nodes differ only in PCI domain (irrelevant to placement)."""
    return {model: derive_slot_map(sim_topology(f"bench-{model}", kind))[0].to_dict()["slots"]
            for model, kind in KINDS.items()}


async def seed(dsn: str, nodes: int, tenants: list[uuid.UUID]) -> None:
    """Schema, then nodes (approved, schedulable), their slots and the quotas, in bulk (COPY)."""
    templates = slot_templates()
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn, "scheduler", ROOT / "services/scheduler/schema")
        await conn.execute("INSERT INTO pools (name, policy) VALUES ('spot', 'spread') ON CONFLICT DO NOTHING")
        node_rows, slot_rows = [], []
        for i in range(nodes):
            nid, model = uuid.UUID(int=i + 1), ("H100", "A100")[i % 2]
            doc = {"slots": templates[model]}
            node_rows.append((nid, f"bench-{i:05d}", model, 8, POOLS[(i // 2) % 2], "schedulable",
                              json.dumps(doc), f"rack-{i // 40}"))
            slot_rows += [(nid, s["index"], json.dumps(s), s["wipe_policy"]) for s in doc["slots"]]
        await conn.copy_records_to_table("nodes", records=node_rows, columns=[
            "id", "name", "gpu_model", "gpu_count", "pool", "status", "approved_slot_map", "rack"])
        await conn.copy_records_to_table("slots", records=slot_rows, columns=["node_id", "idx", "detail", "wipe_policy"])
        quota_rows = [(t, m, p, 10_000, 0) for t in tenants for m in KINDS for p in POOLS]
        await conn.copy_records_to_table("quotas", records=quota_rows,
                                         columns=["tenant_id", "gpu_model", "pool", "limit", "guaranteed"])
    finally:
        await conn.close()


def start_service(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "services.scheduler"], cwd=ROOT, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    for line in proc.stdout:
        if line.startswith("TESSERA_READY"):
            return proc, int(line.strip().rsplit("port=", 1)[1])
    raise RuntimeError("the scheduler exited before it was ready")


async def scrape(port: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def wait_leading(port: int, timeout: float = 300) -> float:
    t0 = time.perf_counter()
    await eventually(lambda: scrape(port), until=lambda metrics: metrics.get("tessera_scheduler_leader", 0) == 1,
                     timeout=timeout, what="the scheduler to become leader")
    return time.perf_counter() - t0


def command(type_: str, data: dict) -> tuple[str, bytes, dict]:
    env = Envelope(id=uuid.uuid4(), type=type_, schema_version=1, occurred_at=utcnow(), tenant_id=data["tenant_id"],
                   correlation_id=str(data.get("allocation_id") or data["gang_id"]),
                   data=json.loads(json.dumps(data, default=str)))
    return f"scheduler.cmd.{type_.split('.')[1]}", env.model_dump_json().encode(), env.headers()


def reserve(rng: random.Random, tenants: list[uuid.UUID]) -> dict:
    shape, gpus = rng.choices([(s, g) for s, g, _ in SHAPES], weights=[w for *_, w in SHAPES])[0]
    saga = uuid.uuid4()
    return {"saga_id": saga, "step": "reserve_slots", "idempotency_key": f"{saga}:reserve_slots",
            "allocation_id": uuid.uuid4(), "tenant_id": rng.choice(tenants), "shape": shape, "gpu_count": gpus,
            "pool": rng.choice(POOLS), "fail_fast": True}


def gang(rng: random.Random, tenants: list[uuid.UUID]) -> dict:
    """A gang of 2-8 members of one shape (the same mix as single requests)."""
    one = reserve(rng, tenants)
    return {"gang_id": uuid.uuid4(), "tenant_id": one["tenant_id"], "shape": one["shape"],
            "gpu_count": one["gpu_count"], "pool": one["pool"], "fail_fast": True, "requested_by": "bench",
            "members": [uuid.uuid4() for _ in range(rng.randint(2, 8))]}


async def release(js, allocation_id: uuid.UUID, tenant_id: uuid.UUID) -> None:
    saga = uuid.uuid4()
    rel = {"saga_id": saga, "step": "release_slots", "idempotency_key": f"{saga}:release_slots",
           "allocation_id": allocation_id, "tenant_id": tenant_id}
    subject, body, headers = command("scheduler.release_slots", rel)
    await js.publish(subject, body, headers=headers)


async def drive(nats_srv: EmbeddedNats, tenants: list[uuid.UUID], n: int, concurrency: int, release_share: float,
                seed_: int, gang_share: float = 0.0) -> dict:
    """Closed loop: ``concurrency`` requests in flight (sent as admin, playing the saga); a share of placed
    allocations is released."""
    nc = await nats.connect(nats_srv.url, **nats_srv.connect_options("admin"))
    js = nc.jetstream()
    waiters: dict[str, asyncio.Future] = {}

    async def on_reply(msg):
        env = json.loads(msg.data)
        key = env["data"].get("gang_id") if env["type"].startswith("scheduler.gang_") else env["data"].get("allocation_id")
        fut = waiters.get(key)
        if fut is not None and not fut.done() and env["type"] != "scheduler.slots_released":
            fut.set_result((time.perf_counter(), env["type"], env["data"]))
    await nc.subscribe("scheduler.evt.>", cb=on_reply)
    rng, todo = random.Random(seed_), list(range(n))
    latencies, outcomes, gang_latencies, racks = [], {}, [], []

    async def worker():
        while todo:
            todo.pop()
            is_gang = rng.random() < gang_share
            data = gang(rng, tenants) if is_gang else reserve(rng, tenants)
            key = str(data["gang_id"] if is_gang else data["allocation_id"])
            waiters[key] = asyncio.get_running_loop().create_future()
            t0 = time.perf_counter()
            subject, body, headers = command("scheduler.reserve_gang" if is_gang else "scheduler.reserve_slots", data)
            await js.publish(subject, body, headers=headers)
            done, kind, answer = await asyncio.wait_for(waiters[key], 120)
            del waiters[key]
            latencies.append(done - t0)
            outcomes[kind] = outcomes.get(kind, 0) + 1
            if is_gang:
                gang_latencies.append(done - t0)
            if kind == "scheduler.gang_placed":
                racks.append(answer["racks"])
            if kind in ("scheduler.slots_reserved", "scheduler.gang_placed") and rng.random() < release_share:
                for aid in data.get("members") or [data["allocation_id"]]:
                    await release(js, aid, data["tenant_id"])
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await nc.close()
    return {"wall_s": wall, "latencies": latencies, "outcomes": outcomes, "gang_latencies": gang_latencies,
            "gang_racks": racks}


async def declare_all_streams(nats_srv: EmbeddedNats) -> None:
    from shared.streams import declare_streams

    nc = await nats.connect(nats_srv.url, **nats_srv.connect_options("admin"))
    try:
        await declare_streams(nc.jetstream())
    finally:
        await nc.close()


async def measure(args, work: Path, nats_srv: EmbeddedNats, pg: EmbeddedPostgres, svc, port: int, tenants) -> dict:
    """Warm up, then the measured stream with CPU, transaction and handler counters around it."""
    await drive(nats_srv, tenants, min(args.concurrency * 4, args.requests), args.concurrency, 0.5, 1)
    pids = {"scheduler": svc.pid, "nats-server": nats_srv.proc.pid, "postgres": pg.proc.pid}
    cpu0, x0, m0 = cpu_of(pids), await xacts(pg.admin_dsn), await scrape(port)
    spy = profile(svc.pid, work / "profile.txt") if args.profile else None
    run = await drive(nats_srv, tenants, args.requests, args.concurrency, args.release_share, 2, args.gang_share)
    cpu1, x1, m1 = cpu_of(pids), await xacts(pg.admin_dsn), await scrape(port)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    return {"run": run, "cpu0": cpu0, "cpu1": cpu1, "txns": x1 - x0, "m0": m0, "m1": m1}


async def service_run(args) -> dict:
    work = work_dir("tessera-bench-sched-")
    print(f"work dir (service log: scheduler.log): {work}", file=sys.stderr)
    nats_srv = EmbeddedNats(work / "nats").start()
    pg = EmbeddedPostgres(work / "pg", durable=True).start()
    svc = None
    try:
        dsn = await provisioned_dsn(pg)
        tenants = [uuid.UUID(int=(1 << 64) + i) for i in range(args.tenants)]
        t0 = time.perf_counter()
        await seed(dsn, args.nodes, tenants)
        seed_s = time.perf_counter() - t0
        await declare_all_streams(nats_srv)   # the scheduler waits for the streams it reads (their owners are not running)
        svc, port = start_service({"TESSERA_NATS_URL": nats_srv.url, "TESSERA_DB_DSN": dsn, "TESSERA_LOG_LEVEL": "WARNING",
                                   "TESSERA_NATS_NKEY_FILE": str(nats_srv.identities.seed_file("scheduler")),
                                   "TESSERA_MAX_WORKERS": str(args.workers), "TESSERA_SCHEDULER_STATS_S": "60"},
                                  work / "scheduler.log")
        load_s = await wait_leading(port)
        m = await measure(args, work, nats_srv, pg, svc, port, tenants)
        baselines = (await js_publish_rate(nats_srv.url, args.concurrency, 4000, **nats_srv.connect_options()),
                     await pg_txn_rate(pg.admin_dsn, args.concurrency, 4000))
    finally:
        if svc is not None:
            svc.terminate()
            svc.wait(30)
        nats_srv.stop()
        pg.stop()
    out = summarise(args, m["run"], seed_s, load_s, m["cpu0"], m["cpu1"], m["txns"], m["m0"], m["m1"], *baselines)
    if args.profile:
        out["profile"] = summarise_profile(work / "profile.txt")
    return out


def profile(pid: int, out: Path) -> subprocess.Popen | None:
    """py-spy (sampling, from outside) on the service for the measured run: where its time goes."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        return None
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), "--format", "raw", "--rate", "200",
                             "--nonblocking", "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _handled(m: dict, type_: str) -> tuple[float, float]:
    key = f'tessera_handler_seconds_%s{{service="scheduler",type="{type_}"}}'
    return m.get(key % "sum", 0.0), m.get(key % "count", 0.0)


def summarise(args, run, seed_s, load_s, cpu0, cpu1, txns, m0, m1, js_rate, pg_rate) -> dict:
    n, lat = args.requests, run["latencies"]
    rate, p99_ms = n / run["wall_s"], round(pct(lat, 0.99) * 1000, 1)
    handled = {t: [b - a for a, b in zip(_handled(m0, t), _handled(m1, t))]
               for t in ("scheduler.reserve_slots", "scheduler.release_slots", "scheduler.reserve_gang")}
    gl, gr = run["gang_latencies"], run["gang_racks"]
    messages = sum(c for _, c in handled.values())
    return {
        "nodes": args.nodes, "gpus": args.nodes * 8, "tenants": args.tenants, "requests": n,
        "concurrency": args.concurrency, "workers": args.workers, "seed_copy_s": round(seed_s, 2),
        "index_load_s": round(load_s, 2), "outcomes": run["outcomes"],
        "decisions_per_s": round(rate, 1), "p50_ms": round(pct(lat, 0.5) * 1000, 1),
        "p99_ms": p99_ms,
        "handler_ms_reserve": round(1000 * handled["scheduler.reserve_slots"][0]
                                    / max(handled["scheduler.reserve_slots"][1], 1), 2),
        "handler_ms_reserve_gang": round(1000 * handled["scheduler.reserve_gang"][0]
                                         / max(handled["scheduler.reserve_gang"][1], 1), 2),
        "gang_share": args.gang_share, "gangs": len(gl),
        "gang_p50_ms": round(pct(gl, 0.5) * 1000, 1) if gl else None,
        "gang_p99_ms": round(pct(gl, 0.99) * 1000, 1) if gl else None,
        "gangs_in_one_rack_share": round(sum(r == 1 for r in gr) / len(gr), 3) if gr else None,
        "messages_handled_per_decision": round(messages / n, 2),
        "pg_transactions_per_decision": round(txns / n, 2),
        "cpu_ms_per_decision": {k: round((cpu1[k] - cpu0.get(k, 0)) / n * 1000, 2) for k in cpu1},
        "baseline_jetstream_acked_publish_per_s": round(js_rate), "baseline_pg_txn_per_s": round(pg_rate),
        "ratio_to_jetstream": round(rate / js_rate, 3), "ratio_to_pg": round(rate / pg_rate, 3),
        "target": TARGET, "meets_target": rate >= TARGET["decisions_per_s"] and p99_ms <= TARGET["p99_ms"],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--tenants", type=int, default=1_000)
    ap.add_argument("--requests", type=int, default=3_000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--workers", type=int, default=8, help="TESSERA_MAX_WORKERS of the service")
    ap.add_argument("--release-share", type=float, default=0.5)
    ap.add_argument("--gang-share", type=float, default=0.1, help="share of requests that are gangs of 2-8 members")
    ap.add_argument("--engine-nodes", type=int, nargs="*", default=[1000, 10000])
    ap.add_argument("--engine-ops", type=int, default=20_000)
    ap.add_argument("--profile", action="store_true", help="py-spy the service during the measured run")
    args = ap.parse_args(argv)
    engine = None
    if args.engine_nodes:
        from tests.bench import bench_scheduler_engine
        engine = bench_scheduler_engine.main(["--nodes", *map(str, args.engine_nodes), "--ops", str(args.engine_ops)])
    service = asyncio.run(service_run(args))
    print(f"service: {service['decisions_per_s']} decisions/s, p50 {service['p50_ms']} ms, p99 {service['p99_ms']} ms "
          f"at {args.nodes} nodes; JetStream {service['baseline_jetstream_acked_publish_per_s']}/s, PostgreSQL "
          f"{service['baseline_pg_txn_per_s']} txn/s; {service['pg_transactions_per_decision']} txn and "
          f"{service['messages_handled_per_decision']} messages per decision; CPU ms/decision "
          f"{service['cpu_ms_per_decision']}; {service['gangs']} gangs, p50 {service['gang_p50_ms']} ms, "
          f"p99 {service['gang_p99_ms']} ms, {service['gangs_in_one_rack_share']} of those placed in one rack",
          file=sys.stderr)
    result = {"bench": "scheduler", "in_process": engine, "service": service, "target": TARGET,
              "meets_target": service["meets_target"]}
    report(result, skip=tuple(result))     # the JSON line only (the figures are on stderr); the work dir then goes
    return result


if __name__ == "__main__":
    main()
