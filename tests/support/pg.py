"""PostgreSQL in integration tests: a fresh schema of a service's tables, with nobody else's rows in it; and what a
call read, from the backend's own counters of the current transaction (no statistics flush to wait for)."""
from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from shared.db import migrate

_READ = """SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid) + pg_stat_get_xact_tuples_fetched(c.oid)), 0)::int
FROM pg_class c WHERE c.oid = $1::regclass OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $1::regclass)"""


@contextlib.asynccontextmanager
async def fresh_schema(provision, prefix: str, sql_dir: Path) -> AsyncIterator[asyncpg.Connection]:
    """A connection (as the schema's own role) to a new schema named ``prefix_<random>``, migrated with
    ``sql_dir``; the schema is dropped afterwards."""
    schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(await provision(schema))
    try:
        await migrate(conn, schema, sql_dir)
        yield conn
    finally:
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")
        await conn.close()


async def read_so_far(conn: asyncpg.Connection, table: str) -> int:
    """Rows and index entries of ``table`` (and of its indexes) read in the transaction open on ``conn``."""
    return await conn.fetchval(_READ, table)


async def reads_of(conn: asyncpg.Connection, table: str, call: Callable[[], Awaitable[Any]]) -> tuple[Any, int]:
    """What ``call()`` returned, and the rows and index entries of ``table`` it read, in a transaction of its own."""
    async with conn.transaction():
        before = await read_so_far(conn, table)
        result = await call()
        return result, await read_so_far(conn, table) - before
