"""Meters in the billing schema: the asyncpg ``MeterRepository``, on the unit of work's connection (the caller
owns the transaction)."""
from __future__ import annotations

import uuid

import asyncpg

from ..domain.model import Meter
from ..domain.ports import MeterRepository

_COLUMNS = ("id", "allocation_id", "tenant_id", "shape", "gpu_count", "started_at", "stopped_at", "user_id",
            "gpu_model", "pool", "spot")


class PgMeterRepository(MeterRepository):
    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    async def get_for_allocation(self, allocation_id: uuid.UUID) -> Meter | None:
        row = await self.conn.fetchrow(f"SELECT {', '.join(_COLUMNS)} FROM meters WHERE allocation_id=$1 FOR UPDATE",
                                       allocation_id)
        return Meter(**{k: row[k] for k in _COLUMNS}) if row else None

    async def add(self, m: Meter) -> None:
        await self.conn.execute(
            "INSERT INTO meters (id, allocation_id, tenant_id, shape, gpu_count, started_at, user_id, gpu_model, pool, "
            "spot) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)",
            m.id, m.allocation_id, m.tenant_id, m.shape, m.gpu_count, m.started_at, m.user_id, m.gpu_model, m.pool,
            m.spot)

    async def save_stop(self, m: Meter) -> None:
        await self.conn.execute("UPDATE meters SET stopped_at=$2, gpu_seconds=$3 WHERE id=$1",
                                m.id, m.stopped_at, m.gpu_seconds)
