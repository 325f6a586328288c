"""Volumes and tenant quotas in the storage schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import uuid

import asyncpg

from ..domain.model import Volume


async def volume_for(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> Volume | None:
    row = await conn.fetchrow("SELECT id, allocation_id, tenant_id, size_gb, created_at FROM volumes WHERE allocation_id=$1",
                              allocation_id)
    return Volume(**dict(row)) if row else None


async def lock_quota(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> int | None:
    """Lock the tenant's quota row (creating it on first use) until the transaction ends; may block.

    Returns the tenant's own limit in GB, or None when the default applies."""
    await conn.execute("INSERT INTO tenant_quotas (tenant_id) VALUES ($1) ON CONFLICT (tenant_id) DO NOTHING", tenant_id)
    return await conn.fetchval("SELECT max_gb FROM tenant_quotas WHERE tenant_id=$1 FOR UPDATE", tenant_id)


async def used_gb(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> int:
    return await conn.fetchval("SELECT coalesce(sum(size_gb), 0) FROM volumes WHERE tenant_id=$1", tenant_id)


async def add(conn: asyncpg.Connection, v: Volume) -> None:
    await conn.execute("INSERT INTO volumes (id, allocation_id, tenant_id, size_gb, created_at) VALUES ($1,$2,$3,$4,$5)",
                       v.id, v.allocation_id, v.tenant_id, v.size_gb, v.created_at)


async def delete_for(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> bool:
    """Delete the allocation's volume; False if it had none (idempotent)."""
    return bool(await conn.fetchval("DELETE FROM volumes WHERE allocation_id=$1 RETURNING true", allocation_id))
