"""Reserving a gang (N allocations, all or nothing) and withdrawing a waiting one.

``reserve_gang``, once per gang id (the gangs table records every decision): a repeat is answered with the
recorded outcome (placed: the same members and slots; queued: its place now; rejected: the same rejection).
Otherwise: resolve the shape (unknown: ``unknown-shape``), let the index decide the whole gang, then:
- placed: every member claimed in one savepoint (gang_claims.py) → ``gang_placed``; in a batch of several gangs,
  the members' claims are made with the batch's others just before it writes (claim_batch.py);
- over quota for N x units → ``gang_rejected`` ``quota-exceeded`` naming the quota; fail fast and nothing fits →
  ``no-capacity``; the tenant's queue bound reached → ``queue-full``;
- otherwise the gang waits whole, holding nothing → ``gang_queued``; a later pass that places it claims it and
  answers ``gang_placed`` (gang_claims.settle_gangs).
``cancel_gang``: a waiting gang is withdrawn → ``gang_rejected`` ``cancelled``; a placed or unknown gang is left
as it is (logged).
"""
from __future__ import annotations

import uuid
from typing import Any

import structlog

from shared.refusals import Refusal, text_safe
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..domain import claims
from ..domain.gang import Gang
from ..domain.ports import SchedulerRepository
from .active import ActiveScheduler, gang_of
from .claim_batch import BatchClaims
from .gang_claims import answer, claim_gang, placed_answer, quota_rejection, rejection
from .placing import refresh_pending_gauge, settle

log = structlog.get_logger()

_ATTEMPTS = 3   # decisions retried after the index proved stale; then the whole index is reloaded


async def reserve_gang(ctx: UnitOfWork, cmd: c.ReserveGang, *, active: ActiveScheduler) -> None:
    """Reserve every member or none (see module docstring). Idempotent per gang id."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    data = cmd.model_dump(mode="json")
    row = await store.gang(cmd.gang_id)
    if row is not None:
        await _again(ctx, active, row)
        return
    shape = active.shapes.get(cmd.shape)
    if shape is None:
        known = ", ".join(sorted(active.shapes))
        await _record(ctx, store, data, "rejected", rejection(data, f"unknown shape {cmd.shape!r} (known: {known})",
                                                              "unknown-shape"))
        return
    if shape.quota_units != cmd.gpu_count:
        await _record(ctx, store, data, "rejected", rejection(
            data, f"shape {shape.name} has {shape.quota_units} GPU(s), the request says {cmd.gpu_count}",
            "invalid-request"))
        return
    try:
        await _decide(ctx, active, store, gang_of(data, shape), data)
    except Exception:
        active.needs_reload = True      # the index may hold a decision this transaction will not commit
        raise


async def _decide(ctx: UnitOfWork, active: ActiveScheduler, store: SchedulerRepository, gang: Gang,
                  data: dict[str, Any]) -> None:
    for _ in range(_ATTEMPTS):
        d = active.sched.submit_gang(gang)
        if d.kind == "placed":
            if d.reason == "already placed":     # the index holds what SQL does not: drop it, decide again
                active.sched.unplace_gang(d.placement)
                continue
            batch = BatchClaims.of(ctx, active)
            try:
                if batch is not None:       # claimed with the batch's other gangs, before it writes
                    batch.leave_gang(ctx, d.placement, data)
                else:
                    await claim_gang(active, store, d.placement, data)
            except claims.SlotTaken:
                continue
            except claims.QuotaExceeded as exc:
                await _record(ctx, store, data, "rejected", quota_rejection(data, exc))
                return
            except claims.ShapeDeleted as exc:
                await _record(ctx, store, data, "rejected", rejection(data, str(exc), "unknown-shape"))
                return
            await _record(ctx, store, data, "placed", placed_answer(d.placement))
            return
        if d.kind == "rejected":
            v = d.quota_verdict
            quota = {"quota": v.quota, "limit": v.limit, "used": v.used, "requested": v.requested} if v else {}
            await _record(ctx, store, data, "rejected", rejection(data, d.reason, d.code, **quota))
            return
        if d.reason == "already pending":       # waiting in the index only (a failed handler): forget it
            active.sched.cancel_gang(gang.gang_id)
            continue
        if not await store.hold_shape(gang.template.shape.name):    # deleted meanwhile: nothing may wait for it
            active.sched.cancel_gang(gang.gang_id)
            await _record(ctx, store, data, "rejected", rejection(data, f"shape {gang.template.shape.name!r} "
                                                                        "was deleted", "unknown-shape"))
            return
        await store.record_gang(data, ctx.causation.correlation_id, "queued", None)
        await _queued(ctx, active, gang.gang_id, gang.tenant_id, d.reason)
        refresh_pending_gauge(active)
        return
    raise RuntimeError(f"the index stayed stale for gang {gang.gang_id}: reloading it")


async def _record(ctx: UnitOfWork, store: SchedulerRepository, data: dict, state: str, outcome: dict) -> None:
    await store.record_gang(data, ctx.causation.correlation_id, state, outcome)
    await answer(ctx, state, outcome)


async def _queued(ctx: UnitOfWork, active: ActiveScheduler, gang_id: uuid.UUID, tenant_id: uuid.UUID,
                  reason: str) -> None:
    await ctx.emit("scheduler.gang_queued", c.GangQueued(gang_id=gang_id, tenant_id=tenant_id,
                                                         position=active.position(tenant_id), reason=reason),
                   tenant_id=tenant_id)


async def _again(ctx: UnitOfWork, active: ActiveScheduler, row: dict) -> None:
    """A repeat of a gang already decided: its recorded answer (a waiting gang: its place now)."""
    if row["state"] == "queued":
        await _queued(ctx, active, row["gang_id"], row["tenant_id"], "already waiting in the queue")
    else:
        await answer(ctx, row["state"], row["outcome"])


async def cancel_gang(ctx: UnitOfWork, cmd: c.CancelGang, *, active: ActiveScheduler) -> None:
    """Withdraw a waiting gang of the tenant (answered ``gang_rejected`` ``cancelled``); otherwise nothing."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)
    row = await store.gang(cmd.gang_id, lock=True)
    if row is None or row["state"] != "queued" or row["tenant_id"] != cmd.tenant_id:
        log.info("scheduler.gang_cancel_ignored", gang_id=str(cmd.gang_id), tenant_id=str(cmd.tenant_id),
                 state=row["state"] if row else None, other_tenant=bool(row) and row["tenant_id"] != cmd.tenant_id)
        return
    outcome = rejection(row["request"], f"cancelled by {text_safe(cmd.requested_by)}", "cancelled")
    await store.decide_gang(cmd.gang_id, "rejected", outcome)
    await answer(ctx, "rejected", outcome, correlation_id=row["correlation_id"])
    active.sched.cancel_gang(cmd.gang_id)
    await settle(ctx, active, active.sched.tick())


def refused_gang(active: ActiveScheduler) -> Refusal:
    """``reserve_gang`` failed for good (its transaction rolled back): answer it rejected so its sender does not
    wait; the index may hold what it decided before failing, so it is reloaded before the next decision."""
    async def on_refused(ctx: UnitOfWork, cmd: c.ReserveGang, reason: str) -> None:
        active.needs_reload = True
        await answer(ctx, "rejected", rejection(cmd.model_dump(mode="json"), text_safe(reason, 2000),
                                                "invalid-request"))
    return on_refused
