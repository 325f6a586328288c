"""Projection of the scheduler's events: inventory documents into their views, and the queue, placement,
refusal and preemption of an allocation into allocations_view.

Each handler runs in the consumer's transaction (inbox dedupe included). Inventory documents are
applied only when newer (version-guarded upserts). The allocation view still only moves forward:
REQUESTED < PROVISIONING (saga started) < QUEUED < PROVISIONING with slots reserved < ACTIVE ...
(``domain.model.advances_to``); every event about an allocation is appended to its event stream.
"""
from __future__ import annotations

import json
import uuid

import structlog

from services.scheduler import contracts as sc
from shared.unit_of_work import UnitOfWork

from .adapters import allocations as repo
from .adapters import inventory
from .domain.model import advances_to

log = structlog.get_logger()


async def _record(ctx: UnitOfWork, allocation_id: uuid.UUID, state: str | None = None, *, placed: bool = False,
                  always: dict | None = None, **fields) -> None:
    """Append the event; set ``always``; move to ``state`` with ``fields`` (None values included) if forward."""
    await repo.lock_events(ctx.conn, allocation_id)
    await repo.append_event(ctx.conn, allocation_id, ctx.causation)
    row = await ctx.conn.fetchrow("SELECT state, placed FROM allocations_view WHERE id=$1 FOR UPDATE", allocation_id)
    if row is None:
        log.warning("projection.unknown_allocation", allocation_id=str(allocation_id), type=ctx.causation.type)
        return
    changes = dict(always or {})
    if state is not None and advances_to(row["state"], row["placed"], state, placed):
        changes.update(fields, state=state)
        if placed:
            changes["placed"] = True
    elif state is not None:
        log.info("projection.stale_state_ignored", allocation_id=str(allocation_id), current=row["state"],
                 event_state=state)
    if changes:
        await repo.update(ctx.conn, allocation_id, **changes)


async def on_reservation_queued(ctx: UnitOfWork, data: sc.ReservationQueued) -> None:
    await _record(ctx, data.allocation_id, "QUEUED", queue_position=data.position, queued_reason=data.reason)


async def on_slots_reserved(ctx: UnitOfWork, data: sc.SlotsReserved) -> None:
    await _record(ctx, data.allocation_id, "PROVISIONING", placed=True, node_id=data.node_id, queue_position=None,
                  queued_reason=None)


async def on_slot_reservation_failed(ctx: UnitOfWork, data: sc.SlotReservationFailed) -> None:
    """The saga fails the allocation on this reply: show FAILED at once, and why (kept even if FAILED came first)."""
    problem = {"code": data.code, "reason": data.reason, "quota": data.quota, "limit": data.limit, "used": data.used,
               "requested": data.requested}
    await _record(ctx, data.allocation_id, "FAILED", always={"problem": json.dumps(problem)}, failed_step=data.step,
                  reason=data.reason, queue_position=None, queued_reason=None)


async def on_preemption_notice(ctx: UnitOfWork, data: sc.PreemptionNotice) -> None:
    preemption = {"reason": data.reason, "grace_deadline": data.grace_deadline.isoformat(),
                  "preempted_for": str(data.preempted_for)}
    await _record(ctx, data.allocation_id, always={"preemption": json.dumps(preemption)})


async def on_node_changed(ctx: UnitOfWork, data: sc.NodeChanged) -> None:
    if not await inventory.apply_node(ctx.conn, data):
        log.info("projection.stale_document_ignored", kind="node", id=str(data.node_id), version=data.version)


async def on_shape_changed(ctx: UnitOfWork, data: sc.ShapeChanged) -> None:
    if not await inventory.apply_shape(ctx.conn, data):
        log.info("projection.stale_document_ignored", kind="shape", id=data.name, version=data.version)


async def on_pool_changed(ctx: UnitOfWork, data: sc.PoolChanged) -> None:
    if not await inventory.apply_pool(ctx.conn, data):
        log.info("projection.stale_document_ignored", kind="pool", id=data.name, version=data.version)


async def on_quota_changed(ctx: UnitOfWork, data: sc.QuotaChanged) -> None:
    if not await inventory.apply_quota(ctx.conn, data):
        log.info("projection.stale_document_ignored", kind="quota", id=str(data.tenant_id), version=data.version)


async def on_admin_command_rejected(ctx: UnitOfWork, data: sc.AdminCommandRejected) -> None:
    log.warning("scheduler.admin_command_rejected", command=data.command, target=data.target, reason=data.reason)
    await inventory.record_rejection(ctx.conn, ctx.causation.id, data.command, data.target, data.reason)


HANDLERS = {
    "scheduler.node_changed": on_node_changed,
    "scheduler.shape_changed": on_shape_changed,
    "scheduler.pool_changed": on_pool_changed,
    "scheduler.quota_changed": on_quota_changed,
    "scheduler.admin_command_rejected": on_admin_command_rejected,
    "scheduler.reservation_queued": on_reservation_queued,
    "scheduler.slots_reserved": on_slots_reserved,
    "scheduler.slot_reservation_failed": on_slot_reservation_failed,
    "scheduler.preemption_notice": on_preemption_notice,
}
