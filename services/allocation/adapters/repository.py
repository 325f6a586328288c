"""Allocations in the allocation schema: the asyncpg ``AllocationRepository``, on the unit of work's
connection (the caller owns the transaction)."""
from __future__ import annotations

import json
import uuid

import asyncpg

from ..domain.model import Allocation
from ..domain.ports import AllocationRepository

_COLUMNS = ("id", "tenant_id", "user_id", "name", "shape", "gpu_count", "volume_gb", "labels", "state",
            "created_at", "updated_at", "node_id", "failed_step", "reason", "options", "interrupted_at",
            "interrupt_category", "reschedules", "release_pending", "release_pending_by")


def _from_row(row: asyncpg.Record) -> Allocation:
    fields = {k: row[k] for k in _COLUMNS}
    fields["labels"] = json.loads(fields["labels"])
    fields["options"] = json.loads(fields["options"])
    return Allocation(**fields)


class PgAllocationRepository(AllocationRepository):
    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    async def get_for_update(self, allocation_id: uuid.UUID) -> Allocation | None:
        row = await self.conn.fetchrow(f"SELECT {', '.join(_COLUMNS)} FROM allocations WHERE id=$1 FOR UPDATE",
                                       allocation_id)
        return _from_row(row) if row else None

    async def add(self, a: Allocation) -> bool:
        inserted = await self.conn.fetchval(
            "INSERT INTO allocations (id, tenant_id, user_id, name, shape, gpu_count, volume_gb, labels, state, "
            "created_at, updated_at, options) VALUES ($1,$2,$3,$4,$5,$6,$7,$8::jsonb,$9,$10,$11,$12::jsonb) "
            "ON CONFLICT (id) DO NOTHING RETURNING true",
            a.id, a.tenant_id, a.user_id, a.name, a.shape, a.gpu_count, a.volume_gb, json.dumps(a.labels), a.state,
            a.created_at, a.updated_at, json.dumps(a.options, default=str))
        return bool(inserted)

    async def save(self, a: Allocation) -> None:
        await self.conn.execute(
            "UPDATE allocations SET state=$2, node_id=$3, failed_step=$4, reason=$5, updated_at=$6, interrupted_at=$7, "
            "interrupt_category=$8, reschedules=$9, release_pending=$10, release_pending_by=$11 WHERE id=$1",
            a.id, a.state, a.node_id, a.failed_step, a.reason, a.updated_at, a.interrupted_at, a.interrupt_category,
            a.reschedules, a.release_pending, a.release_pending_by)
