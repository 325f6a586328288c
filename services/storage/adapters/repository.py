"""Volumes and tenant quotas in the storage schema: the asyncpg ``VolumeRepository``, on the unit of work's
connection (the caller owns the transaction)."""
from __future__ import annotations

import uuid

import asyncpg

from ..domain.model import Volume
from ..domain.ports import VolumeRepository


class PgVolumeRepository(VolumeRepository):
    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    async def volume_for(self, allocation_id: uuid.UUID) -> Volume | None:
        row = await self.conn.fetchrow(
            "SELECT id, allocation_id, tenant_id, size_gb, created_at FROM volumes WHERE allocation_id=$1", allocation_id)
        return Volume(**dict(row)) if row else None

    async def lock_quota(self, tenant_id: uuid.UUID) -> int | None:
        # the row is the lock: created on first use, then locked with FOR UPDATE until the transaction ends
        await self.conn.execute("INSERT INTO tenant_quotas (tenant_id) VALUES ($1) ON CONFLICT (tenant_id) DO NOTHING",
                                tenant_id)
        return await self.conn.fetchval("SELECT max_gb FROM tenant_quotas WHERE tenant_id=$1 FOR UPDATE", tenant_id)

    async def used_gb(self, tenant_id: uuid.UUID) -> int:
        return await self.conn.fetchval("SELECT coalesce(sum(size_gb), 0) FROM volumes WHERE tenant_id=$1", tenant_id)

    async def add(self, v: Volume) -> None:
        await self.conn.execute(
            "INSERT INTO volumes (id, allocation_id, tenant_id, size_gb, created_at) VALUES ($1,$2,$3,$4,$5)",
            v.id, v.allocation_id, v.tenant_id, v.size_gb, v.created_at)

    async def delete_for(self, allocation_id: uuid.UUID) -> bool:
        return bool(await self.conn.fetchval("DELETE FROM volumes WHERE allocation_id=$1 RETURNING true", allocation_id))
