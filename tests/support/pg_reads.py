"""What a statement read: the rows and index entries of a table (and of its indexes) that the current
transaction has read so far, from the backend's own counters (no statistics flush to wait for)."""
from __future__ import annotations

import asyncpg

_READ = """SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid) + pg_stat_get_xact_tuples_fetched(c.oid)), 0)::int
FROM pg_class c WHERE c.oid = $1::regclass OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $1::regclass)"""


async def read_so_far(conn: asyncpg.Connection, table: str) -> int:
    """Rows and index entries of ``table`` read in the transaction open on ``conn``."""
    return await conn.fetchval(_READ, table)
