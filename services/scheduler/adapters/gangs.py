"""Gangs in the scheduler schema (asyncpg): the command, its state, and the answer a repeat gets."""
from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg


def _decode(row: asyncpg.Record) -> dict[str, Any]:
    out = dict(row)
    out["request"] = json.loads(row["request"])
    out["outcome"] = json.loads(row["outcome"]) if row["outcome"] is not None else None
    return out


async def get(conn: asyncpg.Connection, gang_id: uuid.UUID, *, lock: bool = False) -> dict[str, Any] | None:
    row = await conn.fetchrow("SELECT * FROM gangs WHERE gang_id=$1" + (" FOR UPDATE" if lock else ""), gang_id)
    return _decode(row) if row else None


async def record(conn: asyncpg.Connection, request: dict[str, Any], correlation_id: str, state: str,
                 outcome: dict[str, Any] | None) -> dict[str, Any]:
    """Record a new gang's decision; a gang recorded before keeps its row (returned as it is)."""
    row = await conn.fetchrow(
        "INSERT INTO gangs (gang_id, tenant_id, request, correlation_id, state, outcome, decided_at) "
        "VALUES ($1, $2, $3::jsonb, $4, $5, $6::jsonb, CASE WHEN $5 = 'queued' THEN NULL ELSE now() END) "
        "ON CONFLICT (gang_id) DO UPDATE SET gang_id = gangs.gang_id RETURNING *",
        uuid.UUID(str(request["gang_id"])), uuid.UUID(str(request["tenant_id"])), json.dumps(request, default=str),
        correlation_id, state, json.dumps(outcome, default=str) if outcome is not None else None)
    return _decode(row)


async def decide(conn: asyncpg.Connection, gang_id: uuid.UUID, state: str, outcome: dict[str, Any]) -> bool:
    """A waiting gang placed or withdrawn; False when it was not waiting."""
    done = await conn.execute("UPDATE gangs SET state=$2, outcome=$3::jsonb, decided_at=now() "
                              "WHERE gang_id=$1 AND state='queued'", gang_id, state, json.dumps(outcome, default=str))
    return done.endswith(" 1")


async def waiting(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [_decode(r) for r in await conn.fetch("SELECT * FROM gangs WHERE state='queued' ORDER BY enqueued_at")]
