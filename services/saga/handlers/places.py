"""Telling the requests waiting in their tenant's line their places (``saga.allocation_waiting``).

A request is told its place when it joins the line, in that transaction. When the line moves under the
tenant's lock (requests started by ``sagas._fill``, one withdrawn), the waiting ones are told their new
places in that transaction too. An ending saga hands its place over without that lock: it only records that
the line moved (``adapters.lines.moved``), and the deadline loop tells the places (``tell_moved_lines``) under
the lock, from what is committed, so two sagas of one tenant ending at once never leave a place told wrong.
Which changes are told, and what bounds the messages: ``domain.lines.retell``.
"""
from __future__ import annotations

import uuid

import asyncpg
import structlog

from shared.outbox import Outbox
from shared.unit_of_work import UnitOfWork

from ..adapters import lines as line_store
from ..contracts import AllocationWaiting
from ..domain import lines

log = structlog.get_logger()


async def _tell(uow: UnitOfWork, tenant_id: uuid.UUID, told: list[tuple[uuid.UUID, int]]) -> None:
    if not told:
        return
    await line_store.mark_told(uow.conn, told)
    for allocation_id, place in told:
        await uow.emit("saga.allocation_waiting", AllocationWaiting(
            allocation_id=allocation_id, tenant_id=tenant_id, position=place),
            correlation_id=str(allocation_id), tenant_id=tenant_id)


async def tell_joined(uow: UnitOfWork, tenant_id: uuid.UUID, allocation_id: uuid.UUID) -> None:
    """Tell a request that just joined its tenant's line (the caller holds the line's lock) its place."""
    await _tell(uow, tenant_id, [(allocation_id, await line_store.joined_at(uow.conn, tenant_id))])


async def tell_places(uow: UnitOfWork, tenant_id: uuid.UUID) -> int:
    """Tell the tenant's waiting requests whose place changed their new place (the caller holds the line's
    lock). Returns how many were told."""
    told = lines.places(await line_store.waiting(uow.conn, tenant_id))
    await _tell(uow, tenant_id, told)
    return len(told)


async def tell_moved_lines(pool: asyncpg.Pool, outbox: Outbox) -> int:
    """Tell the places in the lines that moved without their tenant's lock, one tenant per transaction,
    skipping a tenant whose line another holds (the next pass takes it). A tenant whose telling raises is
    logged and left to the next pass. Returns how many requests were told. Raises when the database is
    unreachable."""
    async with pool.acquire() as conn:
        tenants = await line_store.moved_lines(conn)
    told = 0
    for tenant_id in tenants:
        try:
            async with UnitOfWork.begin(pool, outbox, name="saga.places") as uow:
                if await line_store.lock(uow.conn, tenant_id, wait=False):
                    await line_store.clear_moves(uow.conn, tenant_id)
                    told += await tell_places(uow, tenant_id)
        except (asyncpg.PostgresError, ValueError) as exc:
            log.error("saga.places_failed", tenant_id=str(tenant_id), error=repr(exc))
    return told
