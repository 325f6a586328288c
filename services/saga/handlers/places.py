"""Telling the requests waiting in their tenant's line their places (``saga.allocation_waiting``), and each that
leaves it to start that it did (``saga.allocation_left_line``, in the transaction that starts it).

A request is told its place when it joins the line, in that transaction. When the line moves under the
tenant's lock (requests started by ``sagas._fill``, one withdrawn), the waiting ones are told their new
places in that transaction too. An ending saga hands its place over without that lock: it only records that
the line moved (``adapters.lines.moved``), and the deadline loop tells the places (``tell_moved_lines``) under
the lock, from what is committed, so two sagas of one tenant ending at once never leave a place told wrong.
Which changes are told, and what bounds the messages: ``domain.lines.retell``. How the deadline loop visits
the lines it finds, one tenant's at a time under its lock (here, and for ``sagas.fill_short_lines``):
``each_free_line``.
"""
from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import structlog

from shared.outbox import Outbox
from shared.unit_of_work import UnitOfWork

from ..adapters import lines as line_store
from ..contracts import AllocationLeftLine, AllocationWaiting
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


async def tell_left(uow: UnitOfWork, tenant_id: uuid.UUID, allocation_id: uuid.UUID) -> None:
    """Tell a request that waited in its tenant's line that it left it: its allocate saga started."""
    await uow.emit("saga.allocation_left_line", AllocationLeftLine(allocation_id=allocation_id, tenant_id=tenant_id),
                   correlation_id=str(allocation_id), tenant_id=tenant_id)


async def tell_places(uow: UnitOfWork, tenant_id: uuid.UUID) -> int:
    """Tell the tenant's waiting requests whose place changed their new place (the caller holds the line's
    lock). Returns how many were told."""
    told = lines.places(await line_store.waiting(uow.conn, tenant_id))
    await _tell(uow, tenant_id, told)
    return len(told)


async def each_free_line(pool: asyncpg.Pool, outbox: Outbox, find: Callable[[asyncpg.Connection], Awaitable[list]],
                         work: Callable[[UnitOfWork, uuid.UUID], Awaitable[int]], *, name: str, failed: str) -> int:
    """What the deadline loop does to the lines it finds (``find``): ``work`` on each tenant's, one tenant per
    transaction under the line's lock, skipping a tenant whose line another holds (the next pass takes it). A
    tenant whose work raises is logged (``failed``) and left to the next pass. Returns the sum of what ``work``
    returned. Raises when the database is unreachable."""
    async with pool.acquire() as conn:
        tenants = await find(conn)
    done = 0
    for tenant_id in tenants:
        try:
            async with UnitOfWork.begin(pool, outbox, name=name) as uow:
                if await line_store.lock(uow.conn, tenant_id, wait=False):
                    done += await work(uow, tenant_id)
        except (asyncpg.PostgresError, ValueError) as exc:
            log.error(failed, tenant_id=str(tenant_id), error=repr(exc))
    return done


async def _tell_moved(uow: UnitOfWork, tenant_id: uuid.UUID) -> int:
    await line_store.clear_moves(uow.conn, tenant_id)
    return await tell_places(uow, tenant_id)


async def tell_moved_lines(pool: asyncpg.Pool, outbox: Outbox) -> int:
    """Tell the places in the lines that moved without their tenant's lock (``each_free_line``). Returns how
    many requests were told."""
    return await each_free_line(pool, outbox, line_store.moved_lines, _tell_moved, name="saga.places",
                                failed="saga.places_failed")
