"""The reserve step (saga participant), its undo (release, made in releases.py), and cancelling a queued request.

Reserve, once per idempotency key (the kit's step outcomes, shared.participant): the recorded outcome
answers any repeat; a request already waiting answers ``reservation_queued`` again (never a second queue
entry or placement). Otherwise: resolve the shape (unknown: failed ``unknown-shape``), let the index
decide, then make it real in SQL:
- placed: claim (quota charged and slots taken conditionally, atomically) → ``slots_reserved``, with the
  node's free slots after the claim and its capacity sequence (adapters/claims.py); in a batch of several,
  the claims are made together just before the batch writes (claim_batch.py);
- the shape deleted meanwhile (a deletion committed before the claim): failed ``unknown-shape``;
- over quota: failed ``quota-exceeded`` naming quota, limit, use and request;
- nothing fits: fail fast → failed ``no-capacity``; else queued (bound reached → failed ``queue-full``)
  → ``reservation_queued``, the outcome recorded as deferred; the final reply is sent, and recorded, when
  the queue places it (placing.settle) or it is cancelled or released. A higher-priority request that
  could fit by preempting also gets preemption notices for its victims (placing.notify_preemption).
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from shared import participant
from shared.participant import Outcome, injected_fault
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.metrics import LATENCY
from ..domain import claims
from ..domain.inventory import Placement
from ..domain.ports import SchedulerRepository
from ..domain.scheduler import Decision
from .active import ActiveScheduler, request_of
from .claim_batch import BatchClaims, made_before
from .common import Rejected, admin
from .placing import (
    commit,
    conclude,
    notify_preemption,
    quota_failure,
    refresh_pending_gauge,
    reserved_result,
    settle,
)
from .releases import release

_ATTEMPTS = 3   # decisions retried after the index proved stale; then the whole index is reloaded
_CANCELLED = {"code": "cancelled"}   # the failure code a late reserve of a compensated key answers


async def reserve_slots(ctx: UnitOfWork, cmd: c.ReserveSlots, *, active: ActiveScheduler,
                        sim_faults: bool = False) -> None:
    """Saga step: reserve slots for the allocation (see module docstring). Idempotent per key."""
    started = time.perf_counter()
    await active.ensure_loaded()
    await made_before(ctx, cmd.allocation_id)     # the same allocation's claim left earlier in the batch
    data = cmd.model_dump(mode="json")
    prior = await participant.recorded(ctx, cmd.idempotency_key)
    if prior is not None and prior.status != "deferred":
        await participant.answer(ctx, c.RESERVE_SLOTS, data, prior, tenant_id=cmd.tenant_id, compensated=_CANCELLED)
        return
    store = active.repository(ctx.conn)
    # the index knows what SQL holds or queues (see may_stand_in_sql): read it only when it may be there
    queued, held = await store.standing(cmd.allocation_id) if active.may_stand_in_sql(cmd.allocation_id) \
        else (False, None)
    if queued:
        await _queued(ctx, active, data, "already waiting in the queue", again=True)
        return
    fault = injected_fault(cmd, sim_faults)
    if fault == "timeout":
        return
    if fault == "fail":
        await conclude(ctx, data, "failed", {"reason": f"injected fault at {cmd.step}", "code": "invalid-request"})
        return
    try:
        outcome = await _decide(ctx, active, store, cmd, data, held)
    except Exception:
        active.needs_reload = True      # the index may hold a decision this transaction will not commit
        raise
    LATENCY.labels(str(cmd.tenant_id), outcome).observe(time.perf_counter() - started)


async def _decide(ctx: UnitOfWork, active: ActiveScheduler, store: SchedulerRepository, cmd: c.ReserveSlots,
                  data: dict, held: dict | None) -> str:
    if held is not None:   # reserved before under another key: the same answer, no second reservation
        node = uuid.UUID(held["node_id"])
        p = Placement(node, held["pool"], held["gpu_model"], tuple(held["slots"]), held["mig_profile"])
        details = await store.slot_details(node, list(held["slots"]))
        await conclude(ctx, data, "done", reserved_result(p, details, capacity=await store.capacity(node)))
        return "placed"
    shape = active.shapes.get(cmd.shape)
    if shape is None:
        return await _fail(ctx, data, f"unknown shape {cmd.shape!r} (known: {', '.join(sorted(active.shapes))})",
                           "unknown-shape")
    if shape.quota_units != cmd.gpu_count:
        return await _fail(ctx, data, f"shape {shape.name} has {shape.quota_units} GPU(s), the request says "
                                      f"{cmd.gpu_count}", "invalid-request")
    req = request_of(data, shape)
    for _ in range(_ATTEMPTS):
        d = active.sched.submit(req)
        if d.kind == "placed":
            if d.reason == "already placed":      # the index holds what SQL does not: drop it, decide again
                active.forget(req.allocation_id)
                continue
            batch = BatchClaims.of(ctx, active)
            if batch is not None:                 # claimed with the batch's others, and answered then
                batch.leave(ctx, req, d.placement, data)
                return "placed"
            try:
                details, capacity = await commit(ctx, active, store, req, d.placement, data)
            except claims.SlotTaken:
                continue
            except claims.QuotaExceeded as exc:
                await conclude(ctx, data, "failed", quota_failure(exc))
                return "rejected"
            except claims.ShapeDeleted as exc:
                return await _fail(ctx, data, str(exc), "unknown-shape")
            await conclude(ctx, data, "done", reserved_result(d.placement, details, capacity=capacity))
            return "placed"
        if d.kind == "rejected":
            await conclude(ctx, data, "failed", _failure(d))
            return "rejected"
        if d.reason == "already pending":        # queued in the index only (a failed handler): forget it
            active.sched.cancel(req.allocation_id)
            continue
        return await _enqueue(ctx, active, store, req, d, data)
    raise RuntimeError(f"the index stayed stale for allocation {cmd.allocation_id}: reloading it")


def _failure(d: Decision) -> dict[str, Any]:
    v = d.quota_verdict
    if v is not None and not v.ok:
        return {"reason": v.reason, "code": "quota-exceeded", "quota": v.quota, "limit": v.limit, "used": v.used,
                "requested": v.requested}
    code = "queue-full" if "pending request" in d.reason else "no-capacity"
    return {"reason": d.reason, "code": code}


async def _fail(ctx: UnitOfWork, data: dict, reason: str, code: str) -> str:
    await conclude(ctx, data, "failed", {"reason": reason, "code": code})
    return "rejected"


async def _enqueue(ctx: UnitOfWork, active: ActiveScheduler, store: SchedulerRepository, req, d: Decision,
                   data: dict) -> str:
    if not await store.hold_shape(req.shape.name):   # deleted meanwhile: nothing may wait for it
        active.sched.cancel(req.allocation_id)
        return await _fail(ctx, data, f"shape {req.shape.name!r} was deleted", "unknown-shape")
    await store.enqueue(data, ctx.causation.correlation_id)
    if d.victims:
        for victim in d.victims:      # a victim placed earlier in this batch: its claim made first, to be found
            await made_before(ctx, victim)
        await notify_preemption(ctx, active, store, req, d.victims)
    await _queued(ctx, active, data, d.reason)
    refresh_pending_gauge(active)
    return "queued"


async def _queued(ctx: UnitOfWork, active: ActiveScheduler, data: dict, reason: str, *, again: bool = False) -> None:
    """Answer ``reservation_queued`` with the request's place now; the first time, record the step deferred."""
    tenant = data["tenant_id"]
    progress = {"tenant_id": tenant, "position": active.position(uuid.UUID(str(tenant))), "reason": reason}
    if again:
        await participant.answer(ctx, c.RESERVE_SLOTS, data, Outcome("deferred", progress))
    else:
        await participant.defer(ctx, c.RESERVE_SLOTS, data, progress)


async def release_slots(ctx: UnitOfWork, cmd: c.ReleaseSlots, *, active: ActiveScheduler) -> None:
    """Saga step or compensation: free the allocation's slots, refund its quota, drop it from the queue
    if it waits there, then re-evaluate the queue (releases.py). Idempotent; safe when nothing was held."""
    await active.ensure_loaded()
    await release(ctx, cmd, active)


async def cancel_request(ctx: UnitOfWork, cmd: c.CancelRequest, *, active: ActiveScheduler) -> None:
    """Withdraw a queued request: its step is answered failed ``cancelled``. Rejected (nothing changes):
    no such pending request, or one of another tenant."""
    await active.ensure_loaded()
    store = active.repository(ctx.conn)

    async def body() -> None:
        row = await store.dequeue(cmd.allocation_id)
        if row is None:
            raise Rejected(f"allocation {cmd.allocation_id} has no pending request")
        if row["tenant_id"] != cmd.tenant_id:
            raise Rejected(f"the pending request of allocation {cmd.allocation_id} belongs to another tenant")
        await conclude(ctx, row["request"], "failed", {"reason": f"cancelled by {cmd.requested_by}",
                                                       "code": "cancelled"}, row["correlation_id"])
        active.sched.cancel(cmd.allocation_id)
        await settle(ctx, active, active.sched.tick())
    await admin(ctx, store, "scheduler.cancel_request", str(cmd.allocation_id), body)
