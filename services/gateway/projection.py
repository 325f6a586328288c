"""Projection handlers: allocation.*, saga.step_changed and scheduler.node_registered → the read model.

Each runs in the consumer's transaction (inbox dedupe included). The allocation view
only moves forward (``domain.model.advances``), whatever order the events arrive in;
every allocation event is appended to ``allocation_events`` and NOTIFYs the streams.
"""
from __future__ import annotations

import uuid

import structlog

from services.allocation import contracts as ac
from services.saga.contracts import SagaStepChanged
from services.scheduler.contracts import NodeRegistered
from shared.unit_of_work import UnitOfWork

from .adapters import allocations as repo
from .adapters import inventory
from .domain.model import advances

log = structlog.get_logger()


async def _record(ctx: UnitOfWork, allocation_id: uuid.UUID, state: str | None = None, **fields) -> None:
    """Append the event; move the view to ``state`` (with ``fields``) if that is forward."""
    await repo.lock_events(ctx.conn, allocation_id)
    await repo.append_event(ctx.conn, allocation_id, ctx.causation)
    if state is None and not fields:
        return
    row = await repo.get(ctx.conn, allocation_id, for_update=True)
    if row is None:
        # not created through this gateway (the POST writes the row before the command exists): nothing to move
        log.warning("projection.unknown_allocation", allocation_id=str(allocation_id), type=ctx.causation.type)
        return
    if state is not None and not advances(row["state"], state):
        log.info("projection.stale_state_ignored", allocation_id=str(allocation_id), current=row["state"], event_state=state)
        return
    changes = {k: v for k, v in fields.items() if v is not None}
    if state is not None:
        changes["state"] = state
    if changes:
        await repo.update(ctx.conn, allocation_id, **changes)


async def on_requested(ctx: UnitOfWork, data: ac.AllocationRequested) -> None:
    await repo.insert(ctx.conn, {
        "id": data.allocation_id, "tenant_id": data.tenant_id, "user_id": data.user_id, "name": data.name,
        "shape": data.shape, "gpu_count": data.gpu_count, "volume_gb": data.volume_gb, "labels": data.labels,
        "state": "REQUESTED", "created_at": data.at, "priority": data.priority, "spot": data.spot, "pool": data.pool,
        "tolerations": data.tolerations, "fail_fast": data.fail_fast, "network_id": data.network_id})
    await _record(ctx, data.allocation_id)


async def on_provisioning(ctx: UnitOfWork, data: ac.AllocationProvisioning) -> None:
    await _record(ctx, data.allocation_id, "PROVISIONING")


async def on_activated(ctx: UnitOfWork, data: ac.AllocationActivated) -> None:
    await _record(ctx, data.allocation_id, "ACTIVE", node_id=data.node_id)


async def on_release_requested(ctx: UnitOfWork, data: ac.AllocationReleaseRequested) -> None:
    await _record(ctx, data.allocation_id, "RELEASING", node_id=data.node_id, reason=data.reason)


async def on_released(ctx: UnitOfWork, data: ac.AllocationReleased) -> None:
    await _record(ctx, data.allocation_id, "RELEASED")


async def on_failed(ctx: UnitOfWork, data: ac.AllocationFailed) -> None:
    await _record(ctx, data.allocation_id, "FAILED", failed_step=data.failed_step, reason=data.reason)


async def on_command_rejected(ctx: UnitOfWork, data: ac.AllocationCommandRejected) -> None:
    # The view is not corrected: a release is only sent for an ACTIVE view, and the real
    # state is never behind the view, so a rejected release means it is already releasing.
    await _record(ctx, data.allocation_id)


async def on_saga_step_changed(ctx: UnitOfWork, data: SagaStepChanged) -> None:
    await _record(ctx, data.allocation_id)


async def on_node_registered(ctx: UnitOfWork, data: NodeRegistered) -> None:
    # the scheduler-aware variant: a late confirmation never overwrites a newer node_changed document
    await inventory.mark_registered(ctx.conn, data.node_id, data.name, data.gpu_model, data.gpu_count)

