"""The coordinator's handlers: start a saga, feed it replies, feed it passed deadlines.

Every handler runs in one transaction, a ``UnitOfWork`` (the consumer's, or one per saga for passed
deadlines): lock the saga, run the pure state machine, persist the new step records (step invoked,
compensation armed, deadline) and write the resulting commands and events to the outbox, all of which
commit together ("persist before send"). Nothing is kept in memory between messages, so a restarted
coordinator carries on from PostgreSQL and the outbox.
"""
from __future__ import annotations

import uuid

import asyncpg
import structlog

from services.allocation.contracts import AllocationReleaseRequested, AllocationRequested, Scheduling
from shared.outbox import Outbox
from shared.unit_of_work import UnitOfWork

from .adapters import repository
from .domain.machine import expired, handle
from .domain.model import Command, Input, Policy, Reply, Saga, Start

log = structlog.get_logger()

REPLY_BASE = ("saga_id", "step", "idempotency_key", "allocation_id")
# what the tenant asked about placement and networking, passed on to the scheduler and network steps
SCHEDULING_INPUT = ("user_id", *Scheduling.model_fields)


async def start_allocate(ctx: UnitOfWork, evt: AllocationRequested, *, policy: Policy) -> None:
    """Create the allocate saga and send its first commands; a second start for the allocation does nothing."""
    data = evt.model_dump(mode="json")
    saga_input = {k: data[k] for k in ("allocation_id", "tenant_id", "shape", "gpu_count", "volume_gb", "labels")}
    saga_input.update({k: data[k] for k in SCHEDULING_INPUT if data.get(k) is not None})
    await _start(ctx, Saga(uuid.uuid4(), "allocate", evt.allocation_id, evt.tenant_id, {**saga_input, "node_id": None}),
                 policy)


async def start_release(ctx: UnitOfWork, evt: AllocationReleaseRequested, *, policy: Policy) -> None:
    """Create the release saga; the node comes from the event, else from the allocate saga's reservation."""
    data = evt.model_dump(mode="json")
    reserved = await repository.reservation(ctx.conn, evt.allocation_id)
    node_id = data["node_id"] or reserved.get("node_id")
    saga_input = {k: data[k] for k in ("allocation_id", "tenant_id", "volume_gb", "labels")}
    if reserved.get("node_id") == node_id:   # the slots to wipe: those the allocate saga reserved on that node
        saga_input.update({k: reserved[k] for k in ("slots", "slot_details") if k in reserved})
    await _start(ctx, Saga(uuid.uuid4(), "release", evt.allocation_id, evt.tenant_id, {**saga_input, "node_id": node_id}),
                 policy)


async def _start(ctx: UnitOfWork, saga: Saga, policy: Policy) -> None:
    now = await repository.create(ctx.conn, saga)
    if now is None:
        log.info("saga.already_started", allocation_id=str(saga.allocation_id), kind=saga.kind)
        return
    await apply(ctx, saga, Start(now), policy)


async def on_reply(ctx: UnitOfWork, reply, *, policy: Policy) -> None:
    """Feed a participant's reply to its saga. Unknown sagas, stale and duplicate replies change nothing."""
    loaded = await repository.get(ctx.conn, reply.saga_id)
    if loaded is None:
        log.warning("saga.reply_for_unknown_saga", saga_id=str(reply.saga_id), type=ctx.causation.type)
        return
    saga, now = loaded
    data = reply.model_dump(mode="json")
    message = Reply(ctx.causation.type, reply.step, reply.idempotency_key,
                    {k: v for k, v in data.items() if k not in REPLY_BASE}, now)
    await apply(ctx, saga, message, policy)


async def expire_due(pool: asyncpg.Pool, outbox: Outbox, policy: Policy, *, limit: int = 100) -> int:
    """Handle passed deadlines, one saga per transaction; returns how many sagas were handled.

    A saga whose handling raises is logged and skipped for the rest of this pass,
    so one broken saga cannot starve the others. Raises when the database is unreachable.
    """
    handled, broken = 0, []
    while handled + len(broken) < limit:
        saga_id = None
        try:
            async with UnitOfWork.begin(pool, outbox, name="saga.deadlines") as uow:
                saga_id = await repository.claim_due(uow.conn, broken)
                if saga_id is None:
                    return handled
                await _expire(uow, saga_id, policy)
            handled += 1
        except Exception as exc:
            if saga_id is None:
                raise
            log.error("saga.deadline_failed", saga_id=str(saga_id), error=repr(exc))
            broken.append(saga_id)
    return handled


async def _expire(uow: UnitOfWork, saga_id: uuid.UUID, policy: Policy) -> None:
    loaded = await repository.get(uow.conn, saga_id)
    if loaded is None:
        return
    saga, now = loaded
    for message in expired(saga, now):
        saga = await apply(uow, saga, message, policy)


async def apply(uow: UnitOfWork, saga: Saga, message: Input, policy: Policy) -> Saga:
    """Run the state machine, persist its new state and queue its actions, in the unit of work."""
    # ``after`` holds the new step records; the step changes worth publishing are among the actions
    after, actions, _changes = handle(saga, message, policy)
    if not actions and after == saga:
        return saga
    await repository.save(uow.conn, saga, after)
    catalog = uow.outbox.catalog
    await uow.emit_many([
        (action.type, catalog.message(action.type).model.model_validate(action.data),
         action.subject_params if isinstance(action, Command) else None)
        for action in actions
    ], correlation_id=str(saga.allocation_id), tenant_id=saga.tenant_id)
    return after
