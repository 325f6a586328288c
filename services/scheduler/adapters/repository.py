"""The scheduler schema: the asyncpg ``SchedulerRepository``, on the unit of work's connection (the caller owns the
transaction). The statements live in the table modules (nodes, catalog, claims, queue), which the periodic loops
use as well; this class only binds them to one connection."""
from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from datetime import datetime

import asyncpg

from ..domain.claims import Claim
from ..domain.ports import Row, SchedulerRepository
from . import catalog, claims, gangs, nodes
from . import queue as pending


class PgSchedulerRepository(SchedulerRepository):
    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    def savepoint(self) -> AbstractAsyncContextManager[None]:
        return self.conn.transaction()

    # --- nodes
    async def node(self, node_id: uuid.UUID, *, lock: bool = False) -> Row | None:
        return await nodes.get(self.conn, node_id, lock=lock)

    async def nodes(self) -> list[Row]:
        return await nodes.all_nodes(self.conn)

    async def node_name_holder(self, name: str) -> uuid.UUID | None:
        return await nodes.name_holder(self.conn, name)

    async def insert_node(self, node_id: uuid.UUID, fields: Row) -> bool:
        return await nodes.insert(self.conn, node_id, fields)

    async def update_node(self, node_id: uuid.UUID, fields: Row) -> None:
        await nodes.update(self.conn, node_id, fields)

    async def node_document(self, node_id: uuid.UUID) -> Row:
        return await nodes.document(self.conn, node_id)

    async def install_slots(self, node_id: uuid.UUID, slots: list[Row]) -> None:
        await nodes.install_slots(self.conn, node_id, slots)

    async def quarantine_slots(self, node_id: uuid.UUID, reasons: dict[int, str]) -> list[int]:
        return await nodes.quarantine(self.conn, node_id, reasons)

    async def return_slot(self, node_id: uuid.UUID, slot: int) -> bool:
        return await nodes.return_slot(self.conn, node_id, slot)

    async def renew_quarantine(self, node_id: uuid.UUID, slot: int, reason: str) -> bool:
        return await nodes.renew_quarantine(self.conn, node_id, slot, reason)

    # --- shapes, pools, quotas
    async def shapes(self) -> list[Row]:
        return await catalog.every_shape(self.conn)

    async def upsert_shape(self, shape: Row) -> Row:
        return await catalog.upsert_shape(self.conn, shape)

    async def pools(self) -> list[Row]:
        return await catalog.all_pools(self.conn)

    async def pool_exists(self, name: str) -> bool:
        return await catalog.pool_exists(self.conn, name)

    async def upsert_pool(self, pool: Row) -> Row:
        return await catalog.upsert_pool(self.conn, pool)

    async def quotas(self) -> list[Row]:
        return await catalog.all_quotas(self.conn)

    async def set_quota(self, tenant_id: uuid.UUID, gpu_model: str, pool: str, user_id: uuid.UUID | None,
                        limit: int, guaranteed: int) -> Row:
        return await catalog.set_quota(self.conn, tenant_id, gpu_model, pool, user_id, limit, guaranteed)

    async def quota_used(self, tenant_id: uuid.UUID, gpu_model: str, pool: str) -> int | None:
        return await claims.quota_used(self.conn, tenant_id, gpu_model, pool)

    # --- holdings
    async def claim(self, claim: Claim, *, count: bool = True) -> tuple[list[Row], Row | None]:
        return await claims.claim(self.conn, claim, count=count)

    async def claim_all(self, claims_: list[Claim]) -> dict[uuid.UUID, Row]:
        return await claims.claim_all(self.conn, claims_)

    async def claim_each(self, claims_: list[Claim]) -> list[tuple[list[Row], Row] | Exception]:
        return await claims.claim_each(self.conn, claims_)

    async def capacity_changed(self, node_ids: list[uuid.UUID]) -> dict[uuid.UUID, Row]:
        return await claims.capacity_changed(self.conn, node_ids)

    async def capacity(self, node_id: uuid.UUID) -> Row:
        return await claims.capacity(self.conn, node_id)

    async def held(self, allocation_id: uuid.UUID) -> Row | None:
        return await claims.held(self.conn, allocation_id)

    async def holdings(self, node_id: uuid.UUID | None = None, known: list[uuid.UUID] = ()) -> list[Row]:
        return await claims.holdings(self.conn, node_id, known)

    async def holdings_on(self, node_id: uuid.UUID) -> int:
        return await claims.holdings_on(self.conn, node_id)

    async def slot_details(self, node_id: uuid.UUID, slots: list[int]) -> list[Row]:
        return await claims.slot_details(self.conn, node_id, slots)

    async def release(self, allocation_id: uuid.UUID) -> tuple[Row | None, Row | None]:
        return await claims.release(self.conn, allocation_id)

    async def withdraw(self, allocation_id: uuid.UUID) -> tuple[Row | None, Row | None, Row | None]:
        return await claims.withdraw(self.conn, allocation_id)

    async def withdraw_each(self, allocation_ids: list[uuid.UUID]) -> list[tuple[Row | None, Row | None, Row | None]]:
        return await claims.withdraw_each(self.conn, allocation_ids)

    async def shape_users(self, name: str) -> tuple[int, int]:
        return await claims.shape_users(self.conn, name)

    async def hold_shape(self, name: str) -> bool:
        return await claims.hold_shape(self.conn, name)

    # --- the queue and preemptions
    async def enqueue(self, request: Row, correlation_id: str) -> datetime:
        return await pending.add(self.conn, request, correlation_id)

    async def pending(self, allocation_id: uuid.UUID, *, lock: bool = False) -> Row | None:
        return await pending.get(self.conn, allocation_id, lock=lock)

    async def all_pending(self) -> list[Row]:
        return await pending.all_pending(self.conn)

    async def dequeue(self, allocation_id: uuid.UUID) -> Row | None:
        return await pending.remove(self.conn, allocation_id)

    async def standing(self, allocation_id: uuid.UUID) -> tuple[bool, Row | None]:
        return await pending.standing(self.conn, allocation_id)

    async def nominate(self, allocation_id: uuid.UUID, node_id: uuid.UUID | None) -> None:
        await pending.nominate(self.conn, allocation_id, node_id)

    async def record_preemption(self, victim: Row, preemptor: uuid.UUID, reason: str, grace_s: float) -> Row | None:
        return await pending.record_preemption(self.conn, victim, preemptor, reason, grace_s)

    async def preemption_pairs(self) -> list[tuple[uuid.UUID, uuid.UUID]]:
        return await pending.preemption_pairs(self.conn)

    # --- gangs
    async def gang(self, gang_id: uuid.UUID, *, lock: bool = False) -> Row | None:
        return await gangs.get(self.conn, gang_id, lock=lock)

    async def record_gang(self, request: Row, correlation_id: str, state: str, outcome: Row | None) -> Row:
        return await gangs.record(self.conn, request, correlation_id, state, outcome)

    async def decide_gang(self, gang_id: uuid.UUID, state: str, outcome: Row) -> bool:
        return await gangs.decide(self.conn, gang_id, state, outcome)

    async def waiting_gangs(self) -> list[Row]:
        return await gangs.waiting(self.conn)
