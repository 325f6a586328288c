"""Turning the index's decisions into committed claims and replies.

A placement decided in memory becomes real only through the repository's ``claim`` (conditional SQL). A request
placed out of the queue (after a release, an approval, an uncordon, a quota raise) is answered here:
its pending row is taken, its slots claimed, and the deferred reserve step finished through the kit
(``shared.participant.finish``): its outcome recorded under the idempotency key it arrived with, and
``scheduler.slots_reserved`` sent with the saga fields it carried, so a redelivered reserve command later
gets that same answer.

Every ``slots_reserved`` carries the node's capacity after the claim (free slots and the node's capacity
sequence, see adapters/claims.py): a single claim counts in its own round trip; ``settle``, which may claim
several times in one transaction, claims without counting and counts once for all its nodes at the end.
"""
from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import structlog

from shared import participant
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.metrics import PENDING, PREEMPTIONS, QUEUE_WAIT
from ..domain import claims
from ..domain.inventory import Placement, Request
from ..domain.ports import SchedulerRepository
from ..domain.queue import QueueFull
from ..domain.quota import QuotaKey
from .active import ActiveScheduler
from .gang_claims import settle_gangs

log = structlog.get_logger()

_DETAIL = ("index", "gpu_pci", "nvme_pci", "ib_vf_pci", "ib_guid", "numa", "nvlink_domain", "cpu_cores", "memory_gb",
           "wipe_policy")


def claim_of(req: Request, p: Placement, cmd: dict[str, Any]) -> claims.Claim:
    user = cmd.get("user_id")
    return claims.Claim(req.allocation_id, req.tenant_id, uuid.UUID(str(user)) if user else None, p.node_id,
                        tuple(p.slots), req.shape.name, p.gpu_model, p.pool, req.shape.quota_units, req.priority,
                        req.spot, p.mig_profile, req.shape.mig_per_gpu)


def reserved_result(p: Placement, details: list[dict], waited_s: float = 0.0,
                    capacity: dict | None = None) -> dict[str, Any]:
    """The extra fields of ``scheduler.slots_reserved`` (also the recorded step outcome); ``capacity``: the
    node's {"free_slots", "seq"} after the claim."""
    return {"node_id": str(p.node_id), "slots": list(p.slots), "gpu_model": p.gpu_model, "pool": p.pool,
            "slot_details": [{k: d.get(k) for k in _DETAIL} for d in details if "gpu_pci" in d],
            "waited_s": round(waited_s, 3), "capacity": capacity}


async def commit(ctx: UnitOfWork, active: ActiveScheduler, store: SchedulerRepository, req: Request, p: Placement,
                 cmd: dict[str, Any], *, count: bool = True) -> tuple[list[dict], dict | None]:
    """Claim what the index decided: (slot details, the node's capacity after it, None unless ``count``).
    On SlotTaken / QuotaExceeded / ShapeDeleted the index is corrected (decision undone, node or quota
    re-read) and the exception propagates; nothing was written."""
    try:
        # quota use: published by a loop
        return await store.claim(claim_of(req, p, cmd), count=count)
    except claims.SlotTaken as exc:
        log.warning("scheduler.index_stale", allocation_id=str(req.allocation_id), error=str(exc))
        active.forget(req.allocation_id)
        await active.resync_node(store, p.node_id)
        raise
    except claims.QuotaExceeded:
        active.forget(req.allocation_id)
        await active.resync_quota(store, QuotaKey(req.tenant_id, p.gpu_model, p.pool))
        raise
    except claims.ShapeDeleted:
        active.forget(req.allocation_id)
        raise


def tenant_of(cmd: dict[str, Any]) -> uuid.UUID:
    return uuid.UUID(str(cmd["tenant_id"]))


async def conclude(ctx: UnitOfWork, cmd: dict[str, Any], status: str, result: dict[str, Any],
                   correlation_id: str | None = None) -> None:
    """Record the reserve step's final outcome and send its reply (done: slots_reserved, else failed) in
    the request's tenant; ``correlation_id``: the original command's, when it is answered later."""
    await participant.finish(ctx, c.RESERVE_SLOTS, cmd, status, result, correlation_id=correlation_id,
                             tenant_id=tenant_of(cmd))


async def place_waiting(ctx: UnitOfWork, active: ActiveScheduler) -> None:
    """Re-evaluate the queue (capacity or quota may have appeared) and answer what it placed."""
    await settle(ctx, active, active.sched.tick())


async def place_released(ctx: UnitOfWork, active: ActiveScheduler, allocation_id: uuid.UUID) -> None:
    """After a release committed: free the allocation in the index, re-evaluate the queue and, in a
    transaction of its own, claim and answer what that placed."""
    placed = active.sched.release(allocation_id)
    if not placed and not active.sched.placed_gangs:
        refresh_pending_gauge(active)
        return
    try:
        async with UnitOfWork.begin(active.pool, ctx.outbox, name=ctx.name, causation=ctx.causation) as uow:
            await settle(uow, active, placed)
    except Exception:
        active.needs_reload = True
        raise


async def settle(ctx: UnitOfWork, active: ActiveScheduler, placed: list[tuple[Request, Placement]]) -> None:
    """Claim and answer each request the index placed out of the queue. The claims do not count capacity;
    once they are all made, the nodes they took slots on are counted at once (in node order, the
    transaction's last locks) and each reply carries its node's count."""
    store = active.repository(ctx.conn)
    claimed = []
    for req, p in placed:
        row = await store.pending(req.allocation_id, lock=True)
        if row is None:
            # The queue entry has not committed yet (its reserve handler is still in its transaction): it waits
            # again and the next pass places it. Had that handler failed, it marked the index for a reload,
            # which drops the request; forgetting it here instead would strand a request that commits later.
            active.forget(req.allocation_id)
            try:
                active.sched.queue.push(req)
            except QueueFull:           # the tenant's queue filled meanwhile: let a reload settle the index
                active.needs_reload = True
            continue
        try:
            async with store.savepoint():
                details, _ = await commit(ctx, active, store, req, p, row["request"], count=False)
                await store.dequeue(req.allocation_id)
        except claims.SlotTaken:
            active.sched.queue.push(req)        # stale index: it waits again, the node was re-read
            continue
        except claims.QuotaExceeded as exc:     # a tenant admin's split for this user is used up
            await store.dequeue(req.allocation_id)
            await conclude(ctx, row["request"], "failed", quota_failure(exc), row["correlation_id"])
            continue
        except claims.ShapeDeleted as exc:      # queued just before its shape's deletion committed
            await store.dequeue(req.allocation_id)
            await conclude(ctx, row["request"], "failed", {"reason": str(exc), "code": "unknown-shape"},
                           row["correlation_id"])
            continue
        claimed.append((req, p, row, details))
    capacity = await store.capacity_changed([p.node_id for _, p, _, _ in claimed])
    for req, p, row, details in claimed:
        waited = (datetime.now(UTC) - row["enqueued_at"]).total_seconds()
        QUEUE_WAIT.labels(str(req.tenant_id)).observe(waited)
        await conclude(ctx, row["request"], "done", reserved_result(p, details, waited, capacity[p.node_id]),
                       row["correlation_id"])
    await settle_gangs(ctx, active)       # the gangs the same passes placed whole
    refresh_pending_gauge(active)


def quota_failure(exc: claims.QuotaExceeded) -> dict[str, Any]:
    return {"reason": str(exc), "code": "quota-exceeded", "quota": exc.quota, "limit": exc.limit,
            "used": exc.used, "requested": exc.requested}


def refresh_pending_gauge(active: ActiveScheduler) -> None:
    counts = active.sched.queue.pending()
    for tenant, n in counts.items():
        PENDING.labels(str(tenant)).set(n)
    for tenant in active.seen_pending - counts.keys():
        PENDING.labels(str(tenant)).set(0)
    active.seen_pending = set(counts)


async def notify_preemption(ctx: UnitOfWork, active: ActiveScheduler, store: SchedulerRepository, req: Request,
                            victims: tuple[uuid.UUID, ...]) -> None:
    """Record each victim with its grace deadline and send ``scheduler.preemption_notice``; the request
    stays queued, nominated to the victims' node (the index reserved it: backfill cannot take it)."""
    node = None
    for victim in victims:
        row = await store.held(victim)
        if row is None:
            continue
        victim_class = "a spot allocation" if row["spot"] else f"priority {row['priority']}"
        reason = f"preempted for allocation {req.allocation_id} (priority {req.priority}) over {victim_class}"
        rec = await store.record_preemption(row, req.allocation_id, reason, active.settings.preemption_grace_s)
        if rec is None:
            continue
        node = row["node_id"]
        PREEMPTIONS.labels(row["pool"]).inc()
        await ctx.emit("scheduler.preemption_notice", c.PreemptionNotice(
            allocation_id=victim, tenant_id=row["tenant_id"], node_id=row["node_id"], reason=reason,
            preempted_for=req.allocation_id, grace_deadline=rec["grace_deadline"]),
            correlation_id=str(victim), tenant_id=row["tenant_id"])
    if node is not None:
        await store.nominate(req.allocation_id, node)
    log.info("scheduler.preemption_noticed", preemptor=str(req.allocation_id), victims=[str(v) for v in victims],
             at=time.time())
