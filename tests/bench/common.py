"""What every benchmark measures besides its own figures: the substrate baselines of the same run (raw
acknowledged JetStream publishes/s, single-row PostgreSQL transactions/s), CPU seconds per process,
transaction counts, percentiles, the services' log lines and a py-spy profile's summary."""
from __future__ import annotations

import asyncio
import collections
import json
import secrets
import time
import uuid
from pathlib import Path

import asyncpg
import nats
import psutil
from nats.js.api import StorageType, StreamConfig

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


def report(result: dict, skip: tuple[str, ...] = ()) -> None:
    """A benchmark's figures, one per line for a reader, then the whole as one JSON object, the last line (the
    line tools read); keys in ``skip`` only in the JSON."""
    shown = {k: v for k, v in result.items() if k not in skip}
    width = max(map(len, shown), default=0) + 2
    for k, v in shown.items():
        print(f"{k:{width}s} {v}")
    print(json.dumps(result), flush=True)
