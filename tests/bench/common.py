"""What every benchmark measures besides its own figures: the substrate baselines of the same run (raw
acknowledged JetStream publishes/s, single-row PostgreSQL transactions/s), CPU seconds per process,
transaction counts, percentiles, the services' log lines and a py-spy profile's summary."""
from __future__ import annotations

import asyncio
import atexit
import collections
import json
import os
import secrets
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import nats
import psutil
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

from shared.db import provision_service, service_dsn
from tooling.embedded import EmbeddedPostgres


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else float("nan")


async def js_publish_rate(url: str, concurrency: int, total: int, **connect) -> float:
    """``connect``: nats.connect's credentials (``EmbeddedNats.connect_options()``: the admin identity)."""
    nc = await nats.connect(url, **connect)
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


def family_cpu_s(pid: int) -> float | None:
    """CPU seconds of a process and all its children (PostgreSQL's backends); None once it is gone."""
    try:
        proc = psutil.Process(pid)
        return sum(p.cpu_times().user + p.cpu_times().system for p in [proc, *proc.children(recursive=True)])
    except psutil.NoSuchProcess:
        return None


def family_runqueue_s(pid: int) -> float | None:
    """Seconds the threads of a process and all its children waited for a CPU while runnable (the kernel's
    schedstat: time on a run queue, not running); None once it is gone. Rising under load with the same work:
    the machine's cores, not the process, held it back."""
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    waited = 0
    for proc in procs:
        for stat in Path(f"/proc/{proc.pid}/task").glob("*/schedstat"):
            try:
                waited += int(stat.read_text().split()[1])
            except (OSError, IndexError, ValueError):
                pass   # a thread or process that ended meanwhile
    return waited / 1e9


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds per process (with its children), and of this load generator alone."""
    out = {name: spent for name, pid in pids.items() if (spent := family_cpu_s(pid)) is not None}
    me = psutil.Process().cpu_times()
    out["load-generator"] = me.user + me.system
    return out


async def xacts(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    finally:
        await conn.close()


async def provisioned_dsn(pg: EmbeddedPostgres, service: str = "scheduler") -> str:
    """A role and schema for ``service`` on the embedded server; its DSN."""
    secret = secrets.token_hex(8)
    admin = await asyncpg.connect(pg.admin_dsn)
    try:
        await provision_service(admin, service, secret)
    finally:
        await admin.close()
    return service_dsn(pg.admin_dsn, service, secret)


def log_problems(logs: list[Path]) -> dict[str, dict[str, int]]:
    """Per log file: how many lines of each (level, event) the services logged (they log at WARNING and
    above, as JSON lines); a line that is not JSON and looks like trouble counts as ``other``."""
    out: dict[str, dict[str, int]] = {}
    for log in sorted(logs):
        seen: collections.Counter = collections.Counter()
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            try:
                rec = json.loads(line)
                seen[f"{rec.get('level', '?')}:{rec.get('event', '?')}"] += 1
            except (ValueError, AttributeError):
                if any(w in line.lower() for w in ("error", "traceback", "exception", "critical")):
                    seen["other"] += 1
        if seen:
            out[log.stem] = dict(seen.most_common())
    return out


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
    def pct_of(c):
        root = str(Path(__file__).resolve().parents[2]) + "/"
        return {k.replace(root, ""): round(100 * v / total, 1) for k, v in c.most_common(top)}
    return {"samples": total, "self_pct": pct_of(self_t), "inclusive_pct_project_code": pct_of(incl)}


_WORK_DIRS: list[Path] = []
_REPORTED: list[bool] = []


def work_dir(prefix: str) -> Path:
    """A new directory for a benchmark's platform (its databases, streams, logs): removed when the process ends
    after ``report`` (a run that completed), kept when it fails, for its logs, or when ``TESSERA_BENCH_KEEP`` is
    set. A run's PostgreSQL and JetStream data take up to 2 GB."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if not _WORK_DIRS:
        atexit.register(_remove_work_dirs)
    _WORK_DIRS.append(path)
    return path


def _remove_work_dirs() -> None:
    if _REPORTED and not os.environ.get("TESSERA_BENCH_KEEP"):
        for path in _WORK_DIRS:
            shutil.rmtree(path, ignore_errors=True)


def report(result: dict, skip: tuple[str, ...] = ()) -> None:
    """A benchmark's figures, one per line for a reader, then the whole as one JSON object, the last line (the
    line tools read); keys in ``skip`` only in the JSON. Its work directories go when the process ends."""
    _REPORTED.append(True)
    shown = {k: v for k, v in result.items() if k not in skip}
    width = max(map(len, shown), default=0) + 2
    for k, v in shown.items():
        print(f"{k:{width}s} {v}")
    print(json.dumps(result), flush=True)


# --- where an allocation's time went: its messages' trail through the services' outboxes and inboxes ---------

_TRAIL = ("SELECT o.id, o.type, o.published_at, e->>'correlation_id' AS allocation_id, "
          "(e->>'occurred_at')::timestamptz AS occurred_at, (e->>'causation_id')::uuid AS cause "
          "FROM {schema}.outbox o, LATERAL (SELECT convert_from(o.body, 'UTF8')::jsonb AS e) b "
          "WHERE e->>'correlation_id' = ANY($1::text[])")


async def message_trails(dsn: str, allocation_ids: list[str]) -> dict[str, dict[uuid.UUID, dict]]:
    """Every message of the allocations (by correlation id) in every service's outbox: its type, the service
    that wrote it, when (``occurred_at``: the envelope's, the writer's clock as its handler wrote it), when its
    relay marked it published (``published_at``: after the stream acknowledged it), its cause, and when each
    service's transaction that handled it began (``handled``: the inbox's ``processed_at``, per schema). Read
    after the run (the outboxes keep published rows an hour), with the admin DSN."""
    conn = await asyncpg.connect(dsn)
    try:
        schemas = [r[0] for r in await conn.fetch(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'outbox' INTERSECT "
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'inbox'")]
        msgs: dict[uuid.UUID, dict] = {}
        for schema in schemas:
            for r in await conn.fetch(_TRAIL.format(schema=f'"{schema}"'), allocation_ids):
                msgs[r["id"]] = {**dict(r), "service": schema, "handled": {}}
        for schema in schemas:
            for r in await conn.fetch(f'SELECT event_id, min(processed_at) AS at FROM "{schema}".inbox '
                                      "WHERE event_id = ANY($1::uuid[]) GROUP BY event_id", list(msgs)):
                msgs[r["event_id"]]["handled"][schema] = r["at"]
    finally:
        await conn.close()
    trails: dict[str, dict[uuid.UUID, dict]] = collections.defaultdict(dict)
    for mid, m in msgs.items():
        trails[m["allocation_id"]][mid] = m
    return trails


async def stored_at(url: str, ids: set[str], **connect) -> dict[str, float]:
    """When JetStream stored each message of ``ids`` (its Nats-Msg-Id; epoch s, the server's clock), read back
    from every stream by a consumer of its own, removed after."""
    nc = await nats.connect(url, **connect)
    js, out = nc.jetstream(), {}
    try:
        for info in await js.streams_info():
            name, left = f"trail_{uuid.uuid4().hex[:8]}", info.state.messages
            if not left:
                continue
            await js.add_consumer(info.config.name, ConsumerConfig(durable_name=name, ack_policy=AckPolicy.NONE,
                                                                   deliver_policy=DeliverPolicy.ALL))
            sub = await js.pull_subscribe_bind(durable=name, stream=info.config.name)
            try:
                while left > 0:
                    batch = await sub.fetch(min(left, 1000), timeout=5)
                    left -= len(batch)
                    for m in batch:
                        if (mid := (m.headers or {}).get("Nats-Msg-Id")) in ids:
                            out[mid] = m.metadata.timestamp.timestamp()
            except TimeoutError:
                pass   # fewer than the stream counted (a message expired meanwhile)
            finally:
                await sub.unsubscribe()
                await js.delete_consumer(info.config.name, name)
    finally:
        await nc.close()
    return out


def critical_path(trail: dict[uuid.UUID, dict], last_type: str) -> list[dict]:
    """The chain of causes that ends in the allocation's ``last_type`` message, first message first."""
    end = next((m for m in trail.values() if m["type"] == last_type), None)
    chain = []
    while end is not None:
        chain.append(end)
        end = trail.get(end["cause"]) if end["cause"] else None
    return chain[::-1]


def segments(chain: list[dict], accepted: float, seen: float,
             stored: dict[str, float] | None = None) -> list[tuple[str, float]]:
    """From the 202 (``accepted``, epoch s) to the last message seen by a subscriber (``seen``), consecutive
    (name, ms) that sum to the whole, each named ``<type>:<part>@<service where the time went>``: for each
    message ``write`` (from the previous point to its handler writing it: the writer's batch and its waits in
    that transaction, e.g. a row lock), ``publish`` (to the stream storing it, ``stored``: the rest of the
    transaction, its commit, the relay's turn and publish; without it, to the relay's mark after the stream's
    ack), both the writer's, and ``deliver`` (to the transaction of the next writer that handled it: its
    consumer's fetch, fair window, a free worker and connection), the reader's."""
    stored = stored or {}
    out, at = [], accepted
    for i, m in enumerate(chain):
        nxt = chain[i + 1]["service"] if i + 1 < len(chain) else None
        handled = m["handled"].get(nxt).timestamp() if nxt in m["handled"] else None
        points = [("write", m["occurred_at"].timestamp()),
                  ("publish", stored.get(str(m["id"])) or (m["published_at"].timestamp() if m["published_at"] else None)),
                  ("deliver", handled if nxt else seen)]
        for part, t in points:
            if t is not None:
                where = m["service"] if part != "deliver" else nxt or "subscriber"
                out.append((f"{m['type']}:{part}@{where}", round((t - at) * 1000, 1)))
                at = t
    return out


def tail_report(rows: list[tuple[float, list[tuple[str, float]]]], base: dict[str, float] | None = None,
                top: int = 5) -> dict:
    """``rows``: (total ms, ``segments``) per allocation. Each segment's p50 over the rows; the mean ms per row
    of each part and service (``write@saga``: the segments' names after the colon), over all rows and over the
    ``top`` slowest; and for those their total and the three segments furthest above ``base`` (a quiet run's p50
    per segment; without it, the three largest): where the tail went."""
    names = list(dict.fromkeys(n for _, segs in rows for n, _ in segs))
    per = {n: [ms for _, segs in rows for name, ms in segs if name == n] for n in names}
    base = base or {}

    def by_where(some):
        spent: collections.Counter = collections.Counter()
        for _, segs in some:
            for n, ms in segs:
                spent[n.partition(":")[2]] += ms
        return {k: round(v / max(1, len(some)), 1) for k, v in spent.items()}
    slowest = []
    for total, segs in sorted(rows, key=lambda r: -r[0])[:top]:
        over = sorted(((n, round(ms - base.get(n, 0.0), 1)) for n, ms in segs), key=lambda s: -s[1])[:3]
        slowest.append({"ms": round(total, 1), "above_quiet_p50_ms" if base else "largest_ms": dict(over)})
    return {"n": len(rows), "p50_ms": {n: round(pct(v, 0.5), 1) for n, v in per.items()}, "mean_ms": by_where(rows),
            "slowest_mean_ms": by_where(sorted(rows, key=lambda r: -r[0])[:top]), "slowest": slowest}


async def tail_of(platform: Any, quiet: list[tuple], loud: list[tuple], last_type: str) -> dict:
    """Where allocations' time from their 202 to their ``last_type`` message went, hop by hop along each one's
    chain of messages (``segments``), for ``quiet`` and ``loud`` samples (allocation id, 202 and ``last_type``
    seen, epoch s) of a running ``platform``: per part and service (``deliver@saga``: from the stream to the
    coordinator's transaction) the mean ms per allocation quiet, loud and over the 5 slowest loud ones; and
    those slowest with the three segments furthest above their quiet p50."""
    trails = await message_trails(platform.database_url, [s[0] for s in quiet + loud])
    stored = await stored_at(platform.nats_url, {str(i) for t in trails.values() for i in t},
                             **platform.connect_options("admin"))

    def rows(samples):
        return [((seen - accepted) * 1000, segments(critical_path(trails.get(aid, {}), last_type), accepted, seen,
                                                    stored)) for aid, accepted, seen in samples]
    calm = tail_report(rows(quiet))
    busy = tail_report(rows(loud), base=calm["p50_ms"])
    spent = sorted(busy["slowest_mean_ms"], key=lambda k: -busy["slowest_mean_ms"][k])
    return {"n": [calm["n"], busy["n"]],
            "mean_ms_quiet_loud_slowest": {k: [calm["mean_ms"].get(k), busy["mean_ms"].get(k),
                                               busy["slowest_mean_ms"][k]] for k in spent},
            "slowest_loud": busy["slowest"]}
