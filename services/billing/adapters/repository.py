"""Meters in the billing schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import uuid

import asyncpg

from ..domain.model import Meter


async def get_for_allocation(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> Meter | None:
    row = await conn.fetchrow("SELECT * FROM meters WHERE allocation_id=$1 FOR UPDATE", allocation_id)
    return Meter(**{k: row[k] for k in ("id", "allocation_id", "tenant_id", "shape", "gpu_count", "started_at", "stopped_at")}) if row else None


async def add(conn: asyncpg.Connection, m: Meter) -> None:
    await conn.execute(
        "INSERT INTO meters (id, allocation_id, tenant_id, shape, gpu_count, started_at) VALUES ($1,$2,$3,$4,$5,$6)",
        m.id, m.allocation_id, m.tenant_id, m.shape, m.gpu_count, m.started_at)


async def save_stop(conn: asyncpg.Connection, m: Meter) -> None:
    await conn.execute("UPDATE meters SET stopped_at=$2, gpu_seconds=$3 WHERE id=$1", m.id, m.stopped_at, m.gpu_seconds)


async def running_count(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM meters WHERE stopped_at IS NULL")
