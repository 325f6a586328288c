"""Allocations in the allocation schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import json
import uuid

import asyncpg

from ..domain.model import Allocation

_COLUMNS = ("id", "tenant_id", "user_id", "name", "shape", "gpu_count", "volume_gb", "labels", "state",
            "created_at", "updated_at", "node_id", "failed_step", "reason", "options")


def _from_row(row: asyncpg.Record) -> Allocation:
    fields = {k: row[k] for k in _COLUMNS}
    fields["labels"] = json.loads(fields["labels"])
    fields["options"] = json.loads(fields["options"])
    return Allocation(**fields)


async def get_for_update(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> Allocation | None:
    """Load the aggregate and lock its row until the caller's transaction ends (may block)."""
    row = await conn.fetchrow(f"SELECT {', '.join(_COLUMNS)} FROM allocations WHERE id=$1 FOR UPDATE", allocation_id)
    return _from_row(row) if row else None


async def add(conn: asyncpg.Connection, a: Allocation) -> bool:
    """Insert a new allocation; False (and no change) if one with that id exists already."""
    inserted = await conn.fetchval(
        "INSERT INTO allocations (id, tenant_id, user_id, name, shape, gpu_count, volume_gb, labels, state, "
        "created_at, updated_at, options) VALUES ($1,$2,$3,$4,$5,$6,$7,$8::jsonb,$9,$10,$11,$12::jsonb) "
        "ON CONFLICT (id) DO NOTHING RETURNING true",
        a.id, a.tenant_id, a.user_id, a.name, a.shape, a.gpu_count, a.volume_gb, json.dumps(a.labels), a.state,
        a.created_at, a.updated_at, json.dumps(a.options, default=str))
    return bool(inserted)


async def save(conn: asyncpg.Connection, a: Allocation) -> None:
    """Write the mutable fields back (the row is locked by get_for_update)."""
    await conn.execute(
        "UPDATE allocations SET state=$2, node_id=$3, failed_step=$4, reason=$5, updated_at=$6 WHERE id=$1",
        a.id, a.state, a.node_id, a.failed_step, a.reason, a.updated_at)
