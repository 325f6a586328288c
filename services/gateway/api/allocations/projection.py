"""The allocation read model (allocations_view, and allocation_events with its NOTIFY to the open streams), fed by
allocation.*, saga.step_changed, saga.allocation_waiting, saga.allocation_left_line and the scheduler's queue,
placement, refusal and preemption of an allocation.

An allocation waiting in its tenant's line (saga.allocation_waiting) stays REQUESTED and shows the queue fields
the scheduler's queue fills: ``queued_reason`` ``tenant_line`` and ``queue_position`` its place (1 = next).
Places only go down while it waits, so the smallest told wins, whatever order the messages arrive in; the
fields are cleared when it leaves the line (saga.allocation_left_line: its saga started; a place told after it is
not shown again) or the view leaves REQUESTED (the scheduler placed or queued it, or it was released).

The saga publishes ``saga.step_changed`` only for step changes no other message states (the rule is
``restated`` in services/saga/domain/machine.py): a step timed out, a resend is scheduled, the coordinator gave
up, or a step was skipped. So an allocation's event stream shows saga steps only for those, and a successful
allocation's shows none: its progress is its own events and the scheduler's. The other participants' commands
and replies (a step invoked, answered, compensated) are not subscribed to, so not in the stream.

Each handler runs in the consumer's transaction (inbox dedupe included). The view only moves
forward, whatever order the events arrive in: ``domain.model.advances`` for the allocation's
own lifecycle, ``advances_to`` once the scheduler is involved (REQUESTED < QUEUED < PROVISIONING, its slots
reserved, < ACTIVE ...). An allocation stays REQUESTED while its allocate saga waits for the scheduler: the saga
tells no one it started (``saga.started`` is for the operators). Every event about an
allocation is appended to its event stream and NOTIFYs the streams watching it. ``slots_reserved`` also
carries the node's free slots after the reservation: shown on the node (``inventory.apply_capacity``).
"""
from __future__ import annotations

import json
import uuid

import structlog

from services.allocation import contracts as ac
from services.saga.contracts import AllocationLeftLine, AllocationWaiting, SagaStepChanged
from services.scheduler import contracts as sc
from shared.unit_of_work import UnitOfWork

from ...adapters import allocations as repo
from ...adapters import inventory
from ...adapters.allocations import append_event
from ...domain.model import advances_to, advancing_from

log = structlog.get_logger()

# queued_reason of an allocation waiting in its tenant's line: the saga's own word for it
TENANT_LINE = AllocationWaiting.model_fields["reason"].default


async def _record(ctx: UnitOfWork, allocation_id: uuid.UUID, state: str | None = None, **fields) -> None:
    """Append the event; move the view to ``state`` (with ``fields``) if that is forward."""
    await append_event(ctx.conn, allocation_id, ctx.causation)
    if state is None:
        return
    changes = {k: v for k, v in fields.items() if v is not None}
    # out of the tenant's line (started, or released from it) with any move
    if await repo.move(ctx.conn, allocation_id, state, advancing_from(state), TENANT_LINE, **changes):
        return
    row = await repo.lock_state(ctx.conn, allocation_id)   # not moved: only to say why
    if row is None:
        # not created through this gateway (the POST writes the row before the command exists): nothing to move
        log.warning("projection.unknown_allocation", allocation_id=str(allocation_id), type=ctx.causation.type)
    else:
        log.info("projection.stale_state_ignored", allocation_id=str(allocation_id), current=row["state"],
                 event_state=state)


async def on_requested(ctx: UnitOfWork, data: ac.AllocationRequested) -> None:
    await repo.insert(ctx.conn, {
        "id": data.allocation_id, "tenant_id": data.tenant_id, "user_id": data.user_id, "name": data.name,
        "shape": data.shape, "gpu_count": data.gpu_count, "volume_gb": data.volume_gb, "labels": data.labels,
        "state": "REQUESTED", "created_at": data.at, "priority": data.priority, "spot": data.spot, "pool": data.pool,
        "tolerations": data.tolerations, "fail_fast": data.fail_fast, "network_id": data.network_id,
        "image": data.guest.image.name if data.guest else None,
        "volumes": [v.model_dump(mode="json") for v in data.volumes], "scratch_class": data.scratch_class,
        "price": data.price.model_dump(mode="json") if data.price is not None else None})
    await _record(ctx, data.allocation_id)


async def on_activated(ctx: UnitOfWork, data: ac.AllocationActivated) -> None:
    instance = data.instance.model_dump_json() if data.instance else None   # what runs on the node (jsonb)
    await _record(ctx, data.allocation_id, "ACTIVE", node_id=data.node_id, instance=instance)


async def on_release_requested(ctx: UnitOfWork, data: ac.AllocationReleaseRequested) -> None:
    await _record(ctx, data.allocation_id, "RELEASING", node_id=data.node_id, reason=data.reason)


async def on_released(ctx: UnitOfWork, data: ac.AllocationReleased) -> None:
    await _record(ctx, data.allocation_id, "RELEASED")


async def on_failed(ctx: UnitOfWork, data: ac.AllocationFailed) -> None:
    await _record(ctx, data.allocation_id, "FAILED", failed_step=data.failed_step, reason=data.reason)


async def on_command_rejected(ctx: UnitOfWork, data: ac.AllocationCommandRejected) -> None:
    # A refused request created nothing: no saga will ever move the REQUESTED view, so it fails with the reason.
    row = await repo.get(ctx.conn, data.allocation_id) if data.command == "allocation.request" else None
    if row is not None and row["state"] == "REQUESTED":
        await _record(ctx, data.allocation_id, "FAILED", failed_step="request", reason=data.reason)
        return
    # Otherwise the view is not corrected: a release is only sent for an ACTIVE view, and the real
    # state is never behind the view, so a rejected release means it is already releasing.
    await _record(ctx, data.allocation_id)


async def on_saga_step_changed(ctx: UnitOfWork, data: SagaStepChanged) -> None:
    """A timeout, retry, give-up or skip: appended to the allocation's stream; the view is not moved."""
    await _record(ctx, data.allocation_id)


async def on_allocation_waiting(ctx: UnitOfWork, data: AllocationWaiting) -> None:
    """Its place in its tenant's line, shown while it is REQUESTED; a larger place than the one shown is an
    older message (places only go down)."""
    await append_event(ctx.conn, data.allocation_id, ctx.causation)
    await ctx.conn.execute(
        "UPDATE allocations_view SET queue_position=$2, queued_reason=$3, updated_at=now() WHERE id=$1 "
        "AND state='REQUESTED' AND NOT line_left "
        "AND (queued_reason IS DISTINCT FROM $3 OR queue_position IS NULL OR queue_position > $2)",
        data.allocation_id, data.position, TENANT_LINE)


async def on_allocation_left_line(ctx: UnitOfWork, data: AllocationLeftLine) -> None:
    """It left its tenant's line (its saga started): no place shown, nor any told later; the scheduler's queue
    fields, when it queued the request already, stay."""
    await append_event(ctx.conn, data.allocation_id, ctx.causation)
    await ctx.conn.execute(
        "UPDATE allocations_view SET line_left=true, updated_at=now(), "
        "queue_position = CASE WHEN queued_reason=$2 THEN NULL ELSE queue_position END, "
        "queued_reason = CASE WHEN queued_reason=$2 THEN NULL ELSE queued_reason END WHERE id=$1",
        data.allocation_id, TENANT_LINE)


# --- the scheduler's part: queue, placement, refusal, preemption --------------------------------------------

async def _record_scheduling(ctx: UnitOfWork, allocation_id: uuid.UUID, state: str | None = None, *,
                             placed: bool = False, always: dict | None = None, **fields) -> str | None:
    """Append the event; set ``always``; move to ``state`` with ``fields`` (None values included) if forward.
    Returns the view's state now (None: no such allocation), the row locked until commit."""
    await append_event(ctx.conn, allocation_id, ctx.causation)
    row = await repo.lock_state(ctx.conn, allocation_id)
    if row is None:
        log.warning("projection.unknown_allocation", allocation_id=str(allocation_id), type=ctx.causation.type)
        return None
    now = row["state"]
    changes = dict(always or {})
    if state is not None and advances_to(row["state"], row["placed"], state, placed):
        changes.update(fields, state=state)
        now = state
        if placed:
            changes["placed"] = True
    elif state is not None:
        log.info("projection.stale_state_ignored", allocation_id=str(allocation_id), current=row["state"],
                 event_state=state)
    if changes:
        await repo.update(ctx.conn, allocation_id, **changes)
    return now


async def _while_interrupted(ctx: UnitOfWork, state: str | None, allocation_id: uuid.UUID, position: int | None,
                             reason: str | None) -> None:
    """An INTERRUPTED allocation waiting to be placed again shows its place in the queue (its state stays
    INTERRUPTED until it is ACTIVE again; the queue's events do not move it). ``state``: the view's, as
    ``_record_scheduling`` left it (the row is locked): any other state has nothing to show."""
    if state != "INTERRUPTED":
        return
    await ctx.conn.execute("UPDATE allocations_view SET queue_position=$2, queued_reason=$3, updated_at=now() "
                           "WHERE id=$1 AND state='INTERRUPTED'", allocation_id, position, reason)


async def on_reservation_queued(ctx: UnitOfWork, data: sc.ReservationQueued) -> None:
    state = await _record_scheduling(ctx, data.allocation_id, "QUEUED", queue_position=data.position,
                                     queued_reason=data.reason)
    await _while_interrupted(ctx, state, data.allocation_id, data.position, data.reason)


async def on_slots_reserved(ctx: UnitOfWork, data: sc.SlotsReserved) -> None:
    state = await _record_scheduling(ctx, data.allocation_id, "PROVISIONING", placed=True, node_id=data.node_id,
                                     queue_position=None, queued_reason=None)
    await _while_interrupted(ctx, state, data.allocation_id, None, None)
    await inventory.apply_capacity(ctx.conn, data.node_id, data.capacity)   # the node's free slots after it


async def on_slot_reservation_failed(ctx: UnitOfWork, data: sc.SlotReservationFailed) -> None:
    """The saga fails the allocation on this reply: show FAILED at once, and why (kept even if FAILED came first)."""
    problem = {"code": data.code, "reason": data.reason, "quota": data.quota, "limit": data.limit, "used": data.used,
               "requested": data.requested}
    await _record_scheduling(ctx, data.allocation_id, "FAILED", always={"problem": json.dumps(problem)},
                             failed_step=data.step, reason=data.reason, queue_position=None, queued_reason=None)


async def on_preemption_notice(ctx: UnitOfWork, data: sc.PreemptionNotice) -> None:
    preemption = {"reason": data.reason, "grace_deadline": data.grace_deadline.isoformat(),
                  "preempted_for": str(data.preempted_for)}
    await _record_scheduling(ctx, data.allocation_id, always={"preemption": json.dumps(preemption)})
