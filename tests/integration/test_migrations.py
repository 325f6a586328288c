"""Migrations against a real PostgreSQL: processes starting together (replicas, or a rack of node-agents that
share one schema) migrate a fresh schema once, none of them failing."""
from __future__ import annotations

import asyncio
import uuid

import asyncpg

from shared.db import migrate


async def test_processes_starting_together_migrate_a_fresh_schema_once_without_an_error(infra, provision):
    schema = f"migrateprobe_{uuid.uuid4().hex[:8]}"   # fresh each run: the race is on its first migration
    dsn = await provision(schema)
    conns = [await asyncpg.connect(dsn) for _ in range(8)]
    try:
        results = await asyncio.gather(*(migrate(conn, schema, None) for conn in conns), return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
        applied = [name for r in results for name in r]
        assert applied and len(applied) == len(set(applied)), "each migration applied exactly once"
        stored = await conns[0].fetchval("SELECT count(*) FROM schema_migrations")
        assert stored == len(applied)
    finally:
        await asyncio.gather(*(conn.close() for conn in conns))
        admin = await asyncpg.connect(infra.admin_dsn)
        try:
            await admin.execute(f"DROP SCHEMA {schema} CASCADE")
        finally:
            await admin.close()
