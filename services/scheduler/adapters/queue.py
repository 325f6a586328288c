"""Pending requests (the queue) and preemptions in the scheduler schema (asyncpg).

A pending row keeps the whole ``reserve_slots`` command and the correlation id of its envelope, so the
final reply (placed, or cancelled) can be sent later, as if the step had just been answered.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import asyncpg


async def add(conn: asyncpg.Connection, request: dict[str, Any], correlation_id: str) -> datetime:
    """Queue a request; returns its enqueue time (the existing one when it was queued before)."""
    return await conn.fetchval(
        "INSERT INTO pending (allocation_id, tenant_id, request, correlation_id, idempotency_key, priority) "
        "VALUES ($1, $2, $3::jsonb, $4, $5, $6) ON CONFLICT (allocation_id) DO UPDATE SET priority = pending.priority "
        "RETURNING enqueued_at",
        uuid.UUID(str(request["allocation_id"])), uuid.UUID(str(request["tenant_id"])), json.dumps(request, default=str),
        correlation_id, request["idempotency_key"], request.get("priority", 0))


def _decode(row: asyncpg.Record) -> dict[str, Any]:
    return {**dict(row), "request": json.loads(row["request"])}


async def get(conn: asyncpg.Connection, allocation_id: uuid.UUID, *, lock: bool = False) -> dict[str, Any] | None:
    row = await conn.fetchrow("SELECT * FROM pending WHERE allocation_id=$1" + (" FOR UPDATE" if lock else ""),
                              allocation_id)
    return _decode(row) if row else None


async def remove(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> dict[str, Any] | None:
    """Take the request out of the queue; returns its row, or None when it was not queued."""
    row = await conn.fetchrow("DELETE FROM pending WHERE allocation_id=$1 RETURNING *", allocation_id)
    return _decode(row) if row else None


async def standing(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> tuple[bool, dict[str, Any] | None]:
    """Where the allocation stands, in one round trip: (whether it waits in the queue, the allocations row
    of what it holds or None)."""
    row = await conn.fetchrow(
        "SELECT EXISTS (SELECT 1 FROM pending WHERE allocation_id=$1) AS queued, "
        "(SELECT to_jsonb(a) FROM allocations a WHERE a.allocation_id=$1) AS held", allocation_id)
    return row["queued"], json.loads(row["held"]) if row["held"] is not None else None


async def all_pending(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [_decode(r) for r in await conn.fetch("SELECT * FROM pending ORDER BY enqueued_at")]


async def count_for(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> int:
    return await conn.fetchval("SELECT count(*) FROM pending WHERE tenant_id=$1", tenant_id)


async def nominate(conn: asyncpg.Connection, allocation_id: uuid.UUID, node_id: uuid.UUID | None) -> None:
    await conn.execute("UPDATE pending SET nominated_node=$2 WHERE allocation_id=$1", allocation_id, node_id)


async def record_preemption(conn: asyncpg.Connection, victim: dict[str, Any], preemptor: uuid.UUID, reason: str,
                            grace_s: float) -> dict[str, Any] | None:
    """Record that ``victim`` (an allocations row) will be preempted; None if it already is."""
    row = await conn.fetchrow(
        "INSERT INTO preemptions (victim, victim_tenant, preemptor, node_id, reason, grace_deadline) "
        "VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6)) ON CONFLICT (victim) DO NOTHING RETURNING *",
        victim["allocation_id"], victim["tenant_id"], preemptor, victim["node_id"], reason, grace_s)
    return dict(row) if row else None


async def due_preemptions(conn: asyncpg.Connection, limit: int = 100) -> list[dict[str, Any]]:
    """Preemptions whose grace period has ended and whose command was not sent yet (locked, skip locked)."""
    rows = await conn.fetch("SELECT * FROM preemptions WHERE sent_at IS NULL AND grace_deadline <= now() "
                            "ORDER BY grace_deadline LIMIT $1 FOR UPDATE SKIP LOCKED", limit)
    return [dict(r) for r in rows]


async def mark_sent(conn: asyncpg.Connection, victim: uuid.UUID) -> None:
    await conn.execute("UPDATE preemptions SET sent_at = now() WHERE victim=$1", victim)


async def preemption_pairs(conn: asyncpg.Connection) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(victim, preemptor) of every preemption whose victim still holds its slots."""
    return [(r["victim"], r["preemptor"]) for r in await conn.fetch(
        "SELECT p.victim, p.preemptor FROM preemptions p JOIN allocations a ON a.allocation_id = p.victim")]


async def preemptions_total(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM preemptions")


async def preempting(conn: asyncpg.Connection) -> set[uuid.UUID]:
    """Victims already noticed and not yet released."""
    return {r["victim"] for r in await conn.fetch(
        "SELECT p.victim FROM preemptions p JOIN allocations a ON a.allocation_id = p.victim")}
