"""Making a gang the index placed real: every member's claim all or none (``claim_all``, one round trip), so SQL
holds all or none.

Each member is claimed through the ordinary ``claim`` path under its own allocation id (quota charged per member,
slots taken conditionally); the first refusal undoes the others, so no member keeps a slot, and the index
undoes the whole gang. A member's own allocate saga later asks ``reserve_slots`` for its allocation id and is
answered from that holding (handlers/reservations.py, the "held" path).
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import structlog

from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..domain import claims
from ..domain.gang import GangPlacement
from ..domain.ports import SchedulerRepository
from ..domain.queue import QueueFull
from ..domain.quota import QuotaKey
from .active import ActiveScheduler

log = structlog.get_logger()


async def claim_gang(active: ActiveScheduler, store: SchedulerRepository, gp: GangPlacement,
                     cmd: dict[str, Any]) -> None:
    """Claim every member, all or none, and count the nodes' capacity once at the end (``claim_all``). On
    SlotTaken / QuotaExceeded / ShapeDeleted nothing was written, the index no longer holds the gang and
    knows what made the claim fail (node or quota re-read); the exception propagates."""
    user = cmd.get("user_id")
    user_id = uuid.UUID(str(user)) if user else None
    members = [claims.Claim(req.allocation_id, req.tenant_id, user_id, p.node_id, tuple(p.slots), req.shape.name,
                            p.gpu_model, p.pool, req.shape.quota_units, req.priority, req.spot, p.mig_profile,
                            req.shape.mig_per_gpu) for req, p in gp.members()]
    try:
        await store.claim_all(members)
    except claims.SlotTaken as exc:
        log.warning("scheduler.index_stale", gang_id=str(gp.gang.gang_id), error=str(exc))
        active.sched.unplace_gang(gp)
        await active.resync_node(store, exc.claim.node_id)
        raise
    except claims.QuotaExceeded as exc:
        active.sched.unplace_gang(gp)
        c = exc.claim
        await active.resync_quota(store, QuotaKey(c.tenant_id, c.gpu_model, c.pool))
        raise
    except claims.ShapeDeleted:
        active.sched.unplace_gang(gp)
        raise


def placed_answer(gp: GangPlacement, waited_s: float = 0.0) -> dict[str, Any]:
    """The ``scheduler.gang_placed`` payload (also what a repeat of the command is answered)."""
    return {"gang_id": str(gp.gang.gang_id), "tenant_id": str(gp.gang.tenant_id),
            "members": [{"allocation_id": str(r.allocation_id), "node_id": str(p.node_id), "slots": list(p.slots),
                         "gpu_model": p.gpu_model, "pool": p.pool} for r, p in gp.members()],
            "racks": gp.racks, "nvlink_domains": gp.nvlink_domains, "waited_s": round(waited_s, 3)}


def rejection(cmd: dict[str, Any], reason: str, code: str, **quota: Any) -> dict[str, Any]:
    """The ``scheduler.gang_rejected`` payload."""
    return {"gang_id": str(cmd["gang_id"]), "tenant_id": str(cmd["tenant_id"]), "reason": reason, "code": code,
            **quota}


def quota_rejection(cmd: dict[str, Any], exc: claims.QuotaExceeded) -> dict[str, Any]:
    return rejection(cmd, str(exc), "quota-exceeded", quota=exc.quota, limit=exc.limit, used=exc.used,
                     requested=exc.requested)


async def answer(ctx: UnitOfWork, state: str, outcome: dict[str, Any], *, correlation_id: str | None = None) -> None:
    """Send the gang's answer: ``gang_placed`` or ``gang_rejected`` (``gang_queued`` is sent by the caller)."""
    type_, model = ("scheduler.gang_placed", c.GangPlaced) if state == "placed" else \
        ("scheduler.gang_rejected", c.GangRejected)
    msg = model(**outcome)
    await ctx.emit(type_, msg, correlation_id=correlation_id, tenant_id=msg.tenant_id)


async def settle_gangs(ctx: UnitOfWork, active: ActiveScheduler) -> None:
    """Claim and answer every gang the index's passes placed whole (``Scheduler.take_placed_gangs``)."""
    store = active.repository(ctx.conn)
    for gp in active.sched.take_placed_gangs():
        row = await store.gang(gp.gang.gang_id, lock=True)
        if row is None or row["state"] != "queued":
            active.sched.unplace_gang(gp)
            if row is None:        # its reserve handler has not committed yet: it waits again (see settle)
                _wait_again(active, gp)
            continue
        try:
            await claim_gang(active, store, gp, row["request"])
        except claims.SlotTaken:
            _wait_again(active, gp)
            continue
        except claims.QuotaExceeded as exc:
            await _decide(ctx, store, row, "rejected", quota_rejection(row["request"], exc))
            continue
        except claims.ShapeDeleted as exc:
            await _decide(ctx, store, row, "rejected", rejection(row["request"], str(exc), "unknown-shape"))
            continue
        waited = (datetime.now(UTC) - row["enqueued_at"]).total_seconds()
        await _decide(ctx, store, row, "placed", placed_answer(gp, waited))


async def _decide(ctx: UnitOfWork, store: SchedulerRepository, row: dict, state: str, outcome: dict) -> None:
    await store.decide_gang(row["gang_id"], state, outcome)
    await answer(ctx, state, outcome, correlation_id=row["correlation_id"])


def _wait_again(active: ActiveScheduler, gp: GangPlacement) -> None:
    try:
        active.sched.restore_gang(gp.gang)
    except QueueFull:               # the tenant's queue filled meanwhile: let a reload settle the index
        active.needs_reload = True
