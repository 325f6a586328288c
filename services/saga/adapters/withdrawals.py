"""Releases of allocations that had not started, in the saga schema (asyncpg; the caller owns the transaction
and holds the tenant's line lock, ``adapters.lines.lock``)."""
from __future__ import annotations

import uuid

import asyncpg


async def state(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> str | None:
    """The allocation's withdrawal: 'withdrawn', 'early', 'after_start', or None (none asked, or done)."""
    return await conn.fetchval("SELECT state FROM saga_withdrawals WHERE allocation_id=$1", allocation_id)


async def record(conn: asyncpg.Connection, allocation_id: uuid.UUID, tenant_id: uuid.UUID,
                 requested_by: uuid.UUID, state: str) -> None:
    await conn.execute(
        "INSERT INTO saga_withdrawals (allocation_id, tenant_id, requested_by, state) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (allocation_id) DO UPDATE SET state = EXCLUDED.state", allocation_id, tenant_id, requested_by,
        state)


async def take_early(conn: asyncpg.Connection, allocation_id: uuid.UUID,
                     tenant_id: uuid.UUID) -> uuid.UUID | None:
    """An early withdrawal of the allocation becomes 'withdrawn'; returns who asked (None: there is none)."""
    return await conn.fetchval(
        "UPDATE saga_withdrawals SET state='withdrawn' WHERE allocation_id=$1 AND tenant_id=$2 AND state='early' "
        "RETURNING requested_by", allocation_id, tenant_id)


async def take_after_start(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> uuid.UUID | None:
    """Remove a release waiting for the allocation's allocate saga to end; returns who asked (None: none)."""
    return await conn.fetchval(
        "DELETE FROM saga_withdrawals WHERE allocation_id=$1 AND state='after_start' RETURNING requested_by",
        allocation_id)


async def allocate_status(conn: asyncpg.Connection, tenant_id: uuid.UUID, allocation_id: uuid.UUID) -> str | None:
    """The status of the allocation's allocate saga, its row locked until the transaction ends (waits for a
    reply being handled); None when it has none."""
    return await conn.fetchval("SELECT status FROM sagas WHERE allocation_id=$1 AND tenant_id=$2 AND kind='allocate' "
                               "FOR UPDATE", allocation_id, tenant_id)
