"""Step outcomes of the reserve step (the kit's ``step_outcomes`` table), recorded by the scheduler itself.

``shared.participant.invoke`` records an outcome when the command is handled; a queued reservation is
answered later, so the scheduler records it then (same table, same meaning: done | failed | compensated).
"""
from __future__ import annotations

import json

import asyncpg


async def lock(conn: asyncpg.Connection, key: str) -> None:
    """Serialise the handling of one idempotency key (and its compensation) until the transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key)


async def get(conn: asyncpg.Connection, key: str) -> tuple[str, dict] | None:
    row = await conn.fetchrow("SELECT status, result FROM step_outcomes WHERE idempotency_key=$1", key)
    return (row["status"], json.loads(row["result"])) if row else None


async def record(conn: asyncpg.Connection, key: str, status: str, result: dict) -> None:
    await conn.execute(
        "INSERT INTO step_outcomes (idempotency_key, status, result) VALUES ($1, $2, $3::jsonb) "
        "ON CONFLICT (idempotency_key) DO UPDATE SET status = EXCLUDED.status, result = EXCLUDED.result, "
        "updated_at = now()", key, status, json.dumps(result, default=str))


async def prior(conn: asyncpg.Connection, key: str, allocation_id) -> tuple[tuple[str, dict] | None, bool, dict | None]:
    """What is known already, in one round trip: (the key's recorded outcome or None, whether the
    allocation waits in the queue, the allocation's holding row or None)."""
    row = await conn.fetchrow(
        "SELECT o.status, o.result, EXISTS (SELECT 1 FROM pending WHERE allocation_id=$2) AS queued, "
        "(SELECT to_jsonb(a) FROM allocations a WHERE a.allocation_id=$2) AS held "
        "FROM (SELECT 1) one LEFT JOIN step_outcomes o ON o.idempotency_key=$1", key, allocation_id)
    outcome = (row["status"], json.loads(row["result"])) if row["status"] is not None else None
    return outcome, row["queued"], json.loads(row["held"]) if row["held"] is not None else None
