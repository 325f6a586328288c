"""The sagas: start one, feed it replies, feed it passed deadlines.

An allocate saga starts only when its tenant has room in its line (``domain.lines``): otherwise the request
waits in the saga schema and the message is acknowledged (held in the stream, it would hold up the requests
of every other tenant behind it); it starts when one of the tenant's sagas ends, in that transaction. A waiting
request is told its place (``places``); a tenant may release one before it starts (``withdrawals``).

Every handler runs in one transaction, a ``UnitOfWork`` (the consumer's, or one per saga for passed
deadlines): lock the saga, run the pure state machine, persist the new step records (step invoked,
compensation armed, deadline) and write the resulting commands and events to the outbox, all of which
commit together ("persist before send"). Nothing is kept in memory between messages, so a restarted
coordinator carries on from PostgreSQL and the outbox.
"""
from __future__ import annotations

import uuid
from functools import partial

import asyncpg
import structlog

from services.allocation.contracts import (
    AllocationInterrupted,
    AllocationReleaseRequested,
    AllocationRequested,
    Scheduling,
)
from shared.outbox import Outbox
from shared.unit_of_work import UnitOfWork

from ..adapters import lines as line_store
from ..adapters import repository
from ..domain import lines
from ..domain.definitions import DEFINITIONS, context
from ..domain.machine import expired, handle
from ..domain.model import Command, Input, Policy, Reply, Saga, Start
from .places import each_free_line, tell_joined, tell_left, tell_places
from .withdrawals import after_allocate, on_request, withdrawn

log = structlog.get_logger()

REPLY_BASE = ("saga_id", "step", "idempotency_key", "allocation_id")
# what the tenant asked about placement and networking, passed on to the scheduler and network steps
SCHEDULING_INPUT = ("user_id", *Scheduling.model_fields)


async def start_allocate(ctx: UnitOfWork, evt: AllocationRequested, *, policy: Policy) -> None:
    """Create the allocate saga and send its first commands, or put the request in its tenant's line when the
    tenant has ``policy.tenant_inflight`` sagas in flight or requests waiting already. Idempotent: a second
    request for the allocation (started or waiting) does nothing; nor does one the tenant withdrew (released
    instead, ``withdrawals.on_request``). Blocks on the tenant's line lock."""
    data = evt.model_dump(mode="json")
    saga_input = {k: data[k] for k in ("allocation_id", "tenant_id", "shape", "gpu_count", "volume_gb", "labels")}
    saga_input.update({k: data[k] for k in SCHEDULING_INPUT if data.get(k) is not None})
    saga = Saga(uuid.uuid4(), "allocate", evt.allocation_id, evt.tenant_id, {**saga_input, "node_id": None})
    await line_store.lock(ctx.conn, saga.tenant_id)
    known, line, withdrawal = await line_store.read(ctx.conn, saga.tenant_id, saga.allocation_id,
                                                    policy.tenant_inflight)
    if withdrawal is not None and await on_request(ctx, saga, withdrawal):
        return
    if known:
        log.info("saga.already_started", allocation_id=str(saga.allocation_id), kind=saga.kind)
    elif lines.admits(line, policy.tenant_inflight):
        await _start(ctx, saga, policy)
    else:
        await line_store.enqueue(ctx.conn, saga)
        await tell_joined(ctx, saga.tenant_id, saga.allocation_id)
        if line.in_flight < policy.tenant_inflight:   # room, yet others wait: a hand-over was missed (adapters.lines)
            await _fill(ctx, saga.tenant_id, policy)


async def start_release(ctx: UnitOfWork, evt: AllocationReleaseRequested, *, policy: Policy) -> None:
    """Create the release saga; the node comes from the event, else from the allocate saga's reservation. An
    allocation withdrawn from its tenant's line had nothing reserved: its release saga only marks it released."""
    data = evt.model_dump(mode="json")
    reserved = await repository.reservation(ctx.conn, evt.allocation_id)
    node_id = data["node_id"] or reserved.get("node_id")
    saga_input = {k: data[k] for k in ("allocation_id", "tenant_id", "volume_gb", "labels")}
    if reserved.get("node_id") == node_id:   # the slots to wipe: those the allocate saga reserved on that node; a
        # bare-metal server's port, to return to the provisioning network before the wipe
        saga_input.update({k: reserved[k] for k in ("slots", "slot_details", "switch_port") if k in reserved})
    if await withdrawn(ctx, evt.allocation_id):
        saga_input["withdrawn"] = True
    await _start(ctx, Saga(uuid.uuid4(), "release", evt.allocation_id, evt.tenant_id, {**saga_input, "node_id": node_id}),
                 policy)


# what a move carries over from the saga that placed the allocation: the request, never the old placement
_CARRIED = ("allocation_id", "tenant_id", "shape", "gpu_count", "volume_gb", "labels", *SCHEDULING_INPUT, "price")


class PlacementNotRecorded(Exception):
    """The interrupted allocation's placement is not in the saga schema (yet): retried (the message is
    redelivered with backoff, then dead-lettered), never guessed."""


async def start_reschedule(ctx: UnitOfWork, evt: AllocationInterrupted, *, policy: Policy) -> None:
    """Move an interrupted allocation (the reschedule saga, one per attempt: a redelivered interruption starts
    nothing new). Its request comes from the saga that placed it where it ran; the old node, slots and address
    are what the move fences and frees and the address it asks to keep; a bare-metal server (its instance made by
    the redfish driver) is powered off first (``bare_metal``). Raises PlacementNotRecorded when no
    saga placed it on the interrupted node (the consumer retries it)."""
    placed = await repository.placed(ctx.conn, evt.allocation_id)
    held = context(placed, DEFINITIONS[placed.kind]) if placed is not None else {}
    if placed is None or str(held.get("node_id")) != str(evt.node_id):
        raise PlacementNotRecorded(f"allocation {evt.allocation_id}: no placement on node {evt.node_id} recorded "
                                   f"(latest: {held.get('node_id')})")
    saga_input = {k: held[k] for k in _CARRIED if held.get(k) is not None}
    saga_input.update({"from_node_id": str(evt.node_id), "old_slots": held.get("slots") or [],
                       "kept_ip_address": held.get("ip_address"), "interrupted_at": evt.interrupted_at.isoformat(),
                       "attempt": evt.attempt, "category": evt.category, "node_id": None})
    if (held.get("instance") or {}).get("driver") == "redfish":   # bare metal: powered off before it moves
        saga_input["bare_metal"] = True
    await _start(ctx, Saga(uuid.uuid4(), "reschedule", evt.allocation_id, evt.tenant_id, saga_input), policy)


async def _start(ctx: UnitOfWork, saga: Saga, policy: Policy) -> bool:
    now = await repository.create(ctx.conn, saga)
    if now is None:
        log.info("saga.already_started", allocation_id=str(saga.allocation_id), kind=saga.kind)
        return False
    await apply(ctx, saga, Start(now), policy)
    return True


async def _start_from_line(ctx: UnitOfWork, saga: Saga, policy: Policy) -> bool:
    """Start a request taken out of its tenant's line and tell it it left (``_start``'s answer)."""
    started = await _start(ctx, saga, policy)
    if started:
        await tell_left(ctx, saga.tenant_id, saga.allocation_id)
    return started


async def _fill(ctx: UnitOfWork, tenant_id: uuid.UUID, policy: Policy) -> int:
    """Start the tenant's oldest waiting requests while it has room; the caller holds the tenant's line.
    Returns how many started."""
    started = 0
    room = lines.room(await line_store.in_flight(ctx.conn, tenant_id, policy.tenant_inflight), policy.tenant_inflight)
    while started < room and (saga := await line_store.take_next(ctx.conn, tenant_id)) is not None:
        started += await _start_from_line(ctx, saga, policy)
    if started:
        await tell_places(ctx, tenant_id)
    return started


async def fill_short_lines(pool: asyncpg.Pool, outbox: Outbox, policy: Policy) -> int:
    """Start waiting requests of tenants that have room (a hand-over an ending saga missed: the request was
    not committed yet), as ``places.each_free_line`` does. Returns how many started."""
    return await each_free_line(pool, outbox, partial(line_store.short_lines, bound=policy.tenant_inflight),
                                partial(_fill, policy=policy), name="saga.lines", failed="saga.line_fill_failed")


async def on_reply(ctx: UnitOfWork, reply, *, policy: Policy) -> None:
    """Feed a participant's reply to its saga. Unknown sagas, stale and duplicate replies change nothing."""
    await ctx.write_last_now(repository.saga_key(reply.saga_id))   # an earlier reply of the batch changed it
    loaded = await repository.get(ctx.conn, reply.saga_id)
    if loaded is None:
        log.warning("saga.reply_for_unknown_saga", saga_id=str(reply.saga_id), type=ctx.causation.type)
        return
    saga, now = loaded
    data = reply.model_dump(mode="json")
    message = Reply(ctx.causation.type, reply.step, reply.idempotency_key,
                    {k: v for k, v in data.items() if k not in REPLY_BASE}, now)
    await apply(ctx, saga, message, policy, last=True)


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


async def apply(uow: UnitOfWork, saga: Saga, message: Input, policy: Policy, *, last: bool = False) -> Saga:
    """Run the state machine, persist its new state and queue its actions, in the unit of work. ``last``: the
    caller reads nothing after it that the new state changes (a reply's handler): the state may be written
    with the batch's outbox rows (``UnitOfWork.write_last``)."""
    # ``after`` holds the new step records; the step changes worth publishing are among the actions
    after, actions, _changes = handle(saga, message, policy)
    if not actions and after == saga:
        return saga
    # a reply's: written with the batch's outbox rows, one round trip fewer
    await uow.write_last(*repository.save_statement(saga, after), now=not last)
    catalog = uow.outbox.catalog
    await uow.emit_many([
        (action.type, catalog.message(action.type).model.model_validate(action.data),
         action.subject_params if isinstance(action, Command) else None)
        for action in actions
    ], correlation_id=str(saga.allocation_id), tenant_id=saga.tenant_id)
    if lines.leaves_flight(saga, after):   # its place in the tenant's line goes to the oldest waiting request
        await uow.write_last_now()          # the line counts the sagas in flight: this one's new state first
        await after_allocate(uow, after)
        waiting = await line_store.take_next_if_room(uow.conn, saga.tenant_id, policy.tenant_inflight)
        if waiting is not None:
            await _start_from_line(uow, waiting, policy)
            await line_store.moved(uow.conn, saga.tenant_id)   # the places behind it are told by the deadline loop
    return after
