"""A tenant's release of an allocation whose allocate saga may not have started (``saga.withdraw``; the gateway
sends it for a REQUESTED or PROVISIONING allocation, as its view shows it).

Decided under the tenant's line lock, the same lock under which requests join the line or start
(``domain.lines.withdrawal``). An allocation waiting in the line leaves it (the others move up) and is
released at once through the allocation's own release: the coordinator sends ``allocation.release`` marked
``withdrawn`` (the only release a REQUESTED allocation takes: it stays REQUESTED while its allocate saga runs), the
allocation becomes RELEASING and announces it, and the release saga that follows skips every step but
``mark_released`` (``withdrawn``: nothing was reserved, no step ran), so it ends RELEASED.

Racing with the allocation's start: an ending saga's hand-over holds the waiting row while it starts the
request, so ``adapters.lines.leave`` waits for it and then finds the request started; its allocate saga's row
is then locked (``adapters.withdrawals.allocate_status``), so the saga cannot end unseen: a release asked
while it runs is kept (``after_start``) and sent once it completes (``after_allocate``, in the transaction
that ends it), the normal release saga following; when it fails, nothing is sent (the allocation is FAILED).
"""
from __future__ import annotations

import uuid

import structlog

from services.allocation.contracts import ReleaseAllocation
from shared.unit_of_work import UnitOfWork

from ..adapters import lines as line_store
from ..adapters import withdrawals as store
from ..contracts import WithdrawAllocation
from ..domain import lines
from ..domain.model import Saga
from .places import tell_places

log = structlog.get_logger()


async def _release(uow: UnitOfWork, allocation_id: uuid.UUID, tenant_id: uuid.UUID, requested_by: uuid.UUID, *,
                   withdrawn: bool = False) -> None:
    """``withdrawn``: no allocate saga ran nor will run for it (the one release a REQUESTED allocation takes)."""
    await uow.emit("allocation.release", ReleaseAllocation(
        allocation_id=allocation_id, tenant_id=tenant_id, requested_by=requested_by, withdrawn=withdrawn),
        correlation_id=str(allocation_id), tenant_id=tenant_id)


async def withdraw(ctx: UnitOfWork, cmd: WithdrawAllocation) -> None:
    """Release the allocation out of its tenant's line at once, or once its allocate saga completes (see the
    module). Idempotent: a repeated command for an allocation withdrawn or waiting for its saga does nothing
    more. Blocks on the tenant's line lock, then on the allocate saga's row lock."""
    conn, alloc, tenant = ctx.conn, cmd.allocation_id, cmd.tenant_id
    await line_store.lock(conn, tenant)
    if await store.state(conn, alloc) is not None:
        log.info("saga.withdrawal_repeated", allocation_id=str(alloc))
        return
    in_line = await line_store.leave(conn, tenant, alloc)
    decision = lines.withdrawal(in_line, None if in_line else await store.allocate_status(conn, tenant, alloc))
    log.info("saga.withdrawal", allocation_id=str(alloc), decision=decision)
    if decision == lines.FROM_LINE:
        await store.record(conn, alloc, tenant, cmd.requested_by, "withdrawn")
        await _release(ctx, alloc, tenant, cmd.requested_by, withdrawn=True)
        await tell_places(ctx, tenant)   # the ones behind it moved up
    elif decision in (lines.EARLY, lines.AFTER_START):
        await store.record(conn, alloc, tenant, cmd.requested_by, decision)
    elif decision == lines.NOW:
        await _release(ctx, alloc, tenant, cmd.requested_by)


async def on_request(ctx: UnitOfWork, saga: Saga, state: str) -> bool:
    """Whether the allocation's request is answered by its withdrawal, in ``state`` (neither started nor put in
    line): one asked before the request came is released now; one withdrawn already does nothing more. The
    caller holds the tenant's line lock, under which it read ``state``."""
    if state == lines.EARLY:
        requested_by = await store.take_early(ctx.conn, saga.allocation_id, saga.tenant_id)
        if requested_by is not None:
            await _release(ctx, saga.allocation_id, saga.tenant_id, requested_by, withdrawn=True)
            return True
    return state == "withdrawn"


async def after_allocate(ctx: UnitOfWork, after: Saga) -> None:
    """An allocate saga just ended (its row locked): a release asked while it ran is sent now if it completed,
    dropped if it failed."""
    requested_by = await store.take_after_start(ctx.conn, after.allocation_id)
    if requested_by is not None and after.status == "completed":
        await _release(ctx, after.allocation_id, after.tenant_id, requested_by)


async def withdrawn(ctx: UnitOfWork, allocation_id: uuid.UUID) -> bool:
    """Whether the allocation was withdrawn before its allocate saga started (its release has nothing to undo)."""
    return await store.state(ctx.conn, allocation_id) == "withdrawn"
