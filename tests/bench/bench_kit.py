"""`./taskw bench:kit` — not a test. The bus kit's own cost, without any service's logic.

An echo service built on the kit exactly like the probe of tests/integration/test_bus_kit.py (its own
contract: command ``kit.ping`` on ``kit.cmd.ping``, event ``kit.pinged`` on ``kit.evt.pinged``; its own
stream TESSERA_KIT; ``Runtime``, ``rt.consumers.subscribe``, ``ctx.emit``) consumes every ping and emits
one pinged: consume → handler → outbox → relay. The platform is durable: embedded NATS with
``sync_interval: always`` and embedded PostgreSQL with fsync, the service with its own role and schema.

The load generator publishes N pings (acknowledged JetStream publishes, default 5,000) from C concurrent
publishers (default 16) after a warm-up, and measures echoes/s = N ÷ (time from the first publish until
the last ``kit.pinged`` of the run is seen on the subject; a core subscription, each ping counted once).
In the same run, on the same server and at the same concurrency, the baseline: raw acknowledged
JetStream publishes/s (``js_publish_rate`` of bench_saga, 600-byte payloads). An echo is two
acknowledged publishes (the ping and the relay's pinged), so a ratio of 0.5 means the kit adds no
more than a second publish would.

A second run measures the kit alone: the service is stopped (SIGSTOP) while N pings are published, then
continued, and timed until the last pinged (``backlog_echo_per_s``, ``backlog_ratio``: one consume, one
handler, one outbox row and one relay publish per echo, against one raw publish).

The echo service runs as its own process (this module with ``--serve``), so its CPU is measured with
psutil apart from the load generator's, like nats-server's and PostgreSQL's (with its backends).
PostgreSQL transactions per echo are the delta of ``pg_stat_database.xact_commit`` ÷ N, read after
the server's statistics have settled (a backend reports its counts at most once a second, an idle one
within 10 s: ``--settle-s``). The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nats
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from pydantic import BaseModel, ConfigDict

from shared.contract import Catalog, Message, ServiceContract, load_catalog
from shared.envelope import Envelope, utcnow
from shared.settings import BusSettings, ServiceSettings
from tests.bench.common import cpu_of, js_publish_rate, log_problems, provisioned_dsn, report, work_dir, xacts
from tooling.embedded import EmbeddedNats, EmbeddedPostgres

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "kit"
STREAM = "TESSERA_KIT"
TARGET_RATIO = 0.5
READY = "KIT_READY"


class Ping(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run: int
    n: int


KIT = ServiceContract(
    service=SERVICE, title="kit", description="benchmark-only echo service",
    messages=[Message("kit.ping", "kit.cmd.ping", Ping, "command", "ping"),
              Message("kit.pinged", "kit.evt.pinged", Ping, "event", "pinged")],
    receives=["kit.ping"],
)


def kit_catalog() -> Catalog:
    return Catalog([*load_catalog().contracts.values(), KIT])


# --- the echo service (its own process) ------------------------------------------------------------------------
async def serve(nats_url: str, db_dsn: str, workers: int, nkey_file: str | None = None) -> None:
    from shared.runtime import Runtime

    # a bench-only service: no contract of the catalog names it, so it connects as admin (nkey_file)
    settings = ServiceSettings(service=SERVICE, nats_url=nats_url, nats_nkey_file=nkey_file, db_dsn=db_dsn, log_level="WARNING",
                               bus=BusSettings(max_workers=workers))
    rt = Runtime(settings, catalog=kit_catalog())

    async def on_ping(ctx, ping: Ping):
        await ctx.emit("kit.pinged", ping)

    rt.consumers.subscribe("kit.ping", on_ping)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await rt.start()
    print(f"{READY} pid={os.getpid()}", flush=True)
    await stop.wait()
    await rt.stop()


def start_service(nats_url: str, dsn: str, workers: int, log: Path, nkey_file: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tests.bench.bench_kit", "--serve", "--workers", str(workers)],
                            cwd=ROOT, env={**os.environ, "KIT_NATS_URL": nats_url, "KIT_DB_DSN": dsn,
                                           "KIT_NATS_NKEY_FILE": nkey_file},
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    for line in proc.stdout:
        if line.startswith(READY):
            return proc
    raise RuntimeError(f"the echo service exited before it was ready (log: {log})")


# --- the load generator ----------------------------------------------------------------------------------------
class Echoes:
    """Counts the pinged events of one run (each ping once) on a core subscription; notes when the last arrives."""

    def __init__(self):
        self.run, self.expected, self.seen = -1, 0, set()
        self.last = 0.0
        self.done = asyncio.Event()
        self.duplicates = 0

    def expect(self, run: int, expected: int) -> None:
        self.run, self.expected, self.seen, self.last = run, expected, set(), 0.0
        self.done = asyncio.Event()

    async def on_msg(self, msg) -> None:
        data = json.loads(msg.data)["data"]
        if data["run"] != self.run:
            return
        if data["n"] in self.seen:
            self.duplicates += 1
            return
        self.seen.add(data["n"])
        self.last = time.perf_counter()
        if len(self.seen) >= self.expected:
            self.done.set()


def pings(run: int, n: int) -> list[tuple[bytes, dict]]:
    """Envelopes built before the clock starts (the load generator's CPU stays out of the measured path)."""
    out = []
    for i in range(n):
        env = Envelope(id=uuid.uuid4(), type="kit.ping", schema_version=1, occurred_at=utcnow(),
                       correlation_id=f"kit-{run}-{i}", data={"run": run, "n": i})
        out.append((env.model_dump_json().encode(), env.headers()))
    return out


async def publish_pings(js, run: int, n: int, concurrency: int) -> None:
    """Publish N pings of ``run`` from ``concurrency`` acknowledged publishers."""
    todo = iter(pings(run, n))

    async def publisher():
        for body, headers in todo:
            await js.publish("kit.cmd.ping", body, headers=headers)
    await asyncio.gather(*(publisher() for _ in range(concurrency)))


async def all_echoed(echoes: Echoes, n: int, timeout: float) -> None:
    try:
        await asyncio.wait_for(echoes.done.wait(), timeout)
    except TimeoutError:
        raise RuntimeError(f"only {len(echoes.seen)} of {n} echoes after {timeout:.0f} s") from None


async def echo_run(js, echoes: Echoes, run: int, n: int, concurrency: int, timeout: float) -> dict:
    """Pings published while the service runs: timed from the first publish to the last pinged."""
    echoes.expect(run, n)
    t0 = time.perf_counter()
    await publish_pings(js, run, n, concurrency)
    published = time.perf_counter() - t0
    await all_echoed(echoes, n, timeout)
    return {"wall_s": echoes.last - t0, "publish_s": published}


async def backlog_run(js, echoes: Echoes, svc: subprocess.Popen, run: int, n: int, concurrency: int,
                      timeout: float) -> dict:
    """The kit alone: the echo service is stopped (SIGSTOP) while N pings are published, then continued;
    timed from SIGCONT until the last pinged (consume → handler → outbox → relay, nothing else running)."""
    echoes.expect(run, n)
    svc.send_signal(signal.SIGSTOP)
    try:
        await publish_pings(js, run, n, concurrency)
    finally:
        svc.send_signal(signal.SIGCONT)
    t0 = time.perf_counter()
    await all_echoed(echoes, n, timeout)
    return {"wall_s": echoes.last - t0}


async def stream_messages(js) -> int:
    return (await js.stream_info(STREAM)).state.messages


async def main(args) -> dict:
    work = work_dir("tessera-bench-kit-")
    print(f"work dir (service log: kit.log): {work}", file=sys.stderr)
    nats_srv = EmbeddedNats(work / "nats").start()          # sync_interval: always
    pg = EmbeddedPostgres(work / "pg", durable=True).start()
    svc = None
    try:
        dsn = await provisioned_dsn(pg, SERVICE)
        nc = await nats.connect(nats_srv.url, **nats_srv.connect_options("admin"))
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=[f"{SERVICE}.>"], storage=StorageType.FILE,
                                         retention=RetentionPolicy.LIMITS, discard=DiscardPolicy.OLD,
                                         duplicate_window=120.0))
        echoes = Echoes()
        await nc.subscribe("kit.evt.pinged", cb=echoes.on_msg)
        svc = start_service(nats_srv.url, dsn, args.workers, work / "kit.log",
                            str(nats_srv.identities.seed_file("admin")))
        timeout = max(120.0, args.n / 20)
        await echo_run(js, echoes, 0, args.warmup, args.concurrency, timeout)   # connections, consumer, caches
        pids = {"echo-service": svc.pid, "nats-server": nats_srv.proc.pid, "postgres": pg.proc.pid}
        await asyncio.sleep(args.settle_s)
        x0, m0, cpu0 = await xacts(pg.admin_dsn), await stream_messages(js), cpu_of(pids)
        run = await echo_run(js, echoes, 1, args.n, args.concurrency, timeout)
        cpu1, m1 = cpu_of(pids), await stream_messages(js)
        await asyncio.sleep(args.settle_s)
        x1 = await xacts(pg.admin_dsn) - 2        # less our own first read's (2 commits a read, measured)
        backlog = await backlog_run(js, echoes, svc, 2, args.n, args.concurrency, timeout)
        raw = await js_publish_rate(nats_srv.url, args.concurrency, max(args.n, 2000), **nats_srv.connect_options())
        await nc.close()
    finally:
        if svc is not None:
            svc.terminate()
            try:
                svc.wait(30)
            except subprocess.TimeoutExpired:
                svc.kill()
        nats_srv.stop()
        pg.stop()
    n = args.n
    rate = n / run["wall_s"]
    cpu = {k: round((cpu1[k] - cpu0.get(k, 0)) / n * 1000, 3) for k in cpu1}
    return {
        "bench": "kit", "echoes": n, "concurrency": args.concurrency, "workers": args.workers,
        "echo_per_s": round(rate, 1),
        "raw_publish_per_s": round(raw, 1),
        "ratio": round(rate / raw, 3),
        "backlog_echo_per_s": round(n / backlog["wall_s"], 1),
        "backlog_ratio": round(n / backlog["wall_s"] / raw, 3),
        "target": TARGET_RATIO, "met": rate / raw >= TARGET_RATIO,
        "backlog_met": n / backlog["wall_s"] / raw >= TARGET_RATIO,
        "echo_wall_s": round(run["wall_s"], 3),
        "ping_publish_per_s_during_run": round(n / run["publish_s"], 1),
        "pg_transactions_per_echo": round((x1 - x0) / n, 2),
        "jetstream_messages_per_echo": round((m1 - m0) / n, 2),
        "cpu_ms_per_echo": cpu,
        "cpu_ms_per_echo_platform": round(sum(v for k, v in cpu.items() if k != "load-generator"), 3),
        "duplicate_echoes_seen": echoes.duplicates,
        "service_log_lines": log_problems([work / "kit.log"]).get("kit", {}),
    }


def cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5000, help="pings in the measured run")
    ap.add_argument("-c", "--concurrency", type=int, default=16, help="concurrent acknowledged publishers")
    ap.add_argument("--warmup", type=int, default=None, help="pings before the measured run (default n/10, 50..500)")
    ap.add_argument("--workers", type=int, default=BusSettings().max_workers, help="the consumer's max_workers")
    ap.add_argument("--settle-s", type=float, default=11.0,
                    help="wait before reading PostgreSQL's transaction counter (its statistics lag)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)   # the echo service's own process
    args = ap.parse_args(argv)
    if args.serve:
        asyncio.run(serve(os.environ["KIT_NATS_URL"], os.environ["KIT_DB_DSN"], args.workers,
                          os.environ.get("KIT_NATS_NKEY_FILE")))
        return
    if args.warmup is None:
        args.warmup = min(500, max(50, args.n // 10))
    t0 = time.perf_counter()
    result = asyncio.run(main(args))
    result["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    report(result)


if __name__ == "__main__":
    cli()
