"""`python -m tests.bench.saga_statements` — not a test. Counts the PostgreSQL statements one allocation costs,
per process and per statement, on a platform of its own (one node of 16 GPUs: ``n`` + the warm-up's 4 must
fit).

PostgreSQL logs every statement (``log_statement = all``, with the connection's application name) while ``n``
allocations are driven at concurrency ``c``; the log is then read back. A transaction's ``BEGIN`` and
``COMMIT`` count as statements (each is a round trip). Background loops (deadlines, pollers) are counted too:
with few allocations they weigh more than under load. The last line is one JSON object."""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import re
from collections.abc import AsyncIterator, Callable

import asyncpg

from tests.bench.bench_saga import drive
from tests.bench.common import report, work_dir
from tooling.platform import Platform

_LINE = re.compile(r"@@(.*?)@@ LOG:  (?:execute [^:]*|statement): (.*)")
# what differs between two runs of one statement: a savepoint's name, a literal array of ids
_VARYING = (re.compile(r"__asyncpg_savepoint_[0-9a-f]+__"), re.compile(r"'\{[0-9a-f,-]+\}'"))


@contextlib.asynccontextmanager
async def statements_logged(platform: Platform) -> AsyncIterator[Callable[[], str]]:
    """PostgreSQL logs every statement (with the connection's application name) inside the block; the callable
    it yields returns what was logged since the block began."""
    admin_conn = await asyncpg.connect(platform.pg.admin_dsn)
    log = platform.pg.data_dir / "postgres.log"
    try:
        await admin_conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        await admin_conn.execute("ALTER SYSTEM SET log_line_prefix = '@@%a@@ '")
        await admin_conn.execute("SELECT pg_reload_conf()")
        start = log.stat().st_size
        yield lambda: log.read_bytes()[start:].decode(errors="replace")
    finally:
        await admin_conn.execute("ALTER SYSTEM RESET log_statement")
        await admin_conn.execute("SELECT pg_reload_conf()")
        await admin_conn.close()


def counted(text: str) -> tuple[collections.Counter, collections.Counter]:
    """The logged statements per process (application name) and per process and statement (its first 100
    characters, what varies between two runs of it replaced)."""
    per_process: collections.Counter = collections.Counter()
    per_statement: collections.Counter = collections.Counter()
    for line in text.splitlines():
        if m := _LINE.match(line):
            per_process[m.group(1)] += 1
            statement = m.group(2)
            for varying in _VARYING:
                statement = varying.sub("…", statement)
            per_statement[f"{m.group(1)}: {statement[:100]}"] += 1
    return per_process, per_statement


async def main(n: int, concurrency: int, top: int) -> dict:
    platform = Platform(work_dir("tessera-statements-"),
                        env={"TESSERA_LOG_LEVEL": "WARNING", "TESSERA_SAGA_TENANT_INFLIGHT": "64"}, durable=True)
    await platform.start()
    try:
        await platform.add_node("bench-000", "V100", 16, env={"TESSERA_SIM_TOPOLOGY": "dgx2-v100-16"})
        async with platform.admin() as admin:
            tenant = await admin.create_tenant("statements")
            await admin.set_quota(tenant["id"], "shared", "V100", 200)
            key = (await admin.create_user(tenant["id"], "bench", "tenant_user"))["api_key"]
        await drive(platform, [key], 4, concurrency)   # warm-up: connections, prepared statements
        async with statements_logged(platform) as logged:
            await drive(platform, [key], n, concurrency)
            text = logged()
    finally:
        await platform.stop()
    per_process, per_statement = counted(text)
    return {"allocations": n, "concurrency": concurrency,
            "statements_per_allocation": round(sum(per_process.values()) / n, 1),
            "per_process": {k: round(v / n, 1) for k, v in per_process.most_common()},
            "top_statements": {k: round(v / n, 2) for k, v in per_statement.most_common(top)}}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10, help="allocations counted (at most 12: one node of 16 GPUs)")
    ap.add_argument("-c", "--concurrency", type=int, default=4)
    ap.add_argument("--top", type=int, default=30, help="statements listed")
    args = ap.parse_args()
    report(asyncio.run(main(min(args.n, 12), args.concurrency, args.top)), skip=("top_statements",))
