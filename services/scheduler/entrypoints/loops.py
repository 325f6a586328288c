"""The active scheduler's background work: leadership, preemptions whose grace has ended, stats.

Only the leader consumes commands (its subscribers are the kit's leader-only ones) and runs the loops that
act; a standby waits on the advisory lock. When leadership is lost the subscribers stop and the index is
dropped: whoever leads next reloads it from PostgreSQL. Every transaction here is a ``UnitOfWork``.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

import structlog

from services.allocation.contracts import PreemptAllocation
from shared.unit_of_work import UnitOfWork
from shared.envelope import utcnow
from shared.runtime import Runtime

from .. import contracts as c
from ..adapters import catalog
from ..adapters import queue as pending
from ..adapters.leader import LeaderLease
from ..adapters.metrics import FRAGMENTATION, LEADER, UTILISATION
from ..handlers import ActiveScheduler
from ..handlers.placing import settle

log = structlog.get_logger()


class Leadership:
    """Consume (and decide) only while holding the lease."""

    def __init__(self, rt: Runtime, active: ActiveScheduler, lease: LeaderLease | None):
        self.rt, self.active, self.lease = rt, active, lease
        self.leading = asyncio.Event()

    async def run(self) -> None:
        if self.lease is None:      # election off: every replica consumes (the SQL guards alone apply)
            await self.active.load(self.rt.pool)
            await self.rt.consumers.start_leader_only()
            self.leading.set()
            await asyncio.Event().wait()
        while True:
            await self.lease.acquire()
            try:
                await self.active.load(self.rt.pool)
                await announce_catalog(self.rt)
                await self.rt.consumers.start_leader_only()
                self.leading.set()
                LEADER.set(1)
                await self.lease.watch()
            finally:
                LEADER.set(0)
                self.leading.clear()
                await self.rt.consumers.stop_leader_only()
                self.active.unload()
                await self.lease.release()
            # A replica that just lost its session stands back for a few probes, so a healthy standby
            # takes over rather than the one whose connection failed.
            await asyncio.sleep(self.lease.probe_s * 4)


async def announce_catalog(rt: Runtime) -> int:
    """Publish every shape and pool as it stands (read models ignore versions they have), so what the
    migrations seeded (the standard shapes, the shared pool) is known before any admin changes it."""
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="scheduler.announce_catalog") as uow:
        shapes, pools = await catalog.all_shapes(uow.conn), await catalog.all_pools(uow.conn)
        items = [("scheduler.shape_changed", c.ShapeChanged(**{k: r[k] for k in c.ShapeChanged.model_fields}), None)
                 for r in shapes]
        items += [("scheduler.pool_changed", c.PoolChanged(**{k: r[k] for k in c.PoolChanged.model_fields}), None)
                  for r in pools]
        if items:
            await uow.emit_many(items, correlation_id="scheduler.catalog")
    return len(items)


async def while_leading(leadership: Leadership, every_s: float, step: Callable[[], Awaitable[object]]) -> None:
    """Run ``step`` every ``every_s`` seconds, while this replica is the leader."""
    while True:
        await leadership.leading.wait()
        await step()
        await asyncio.sleep(every_s)


async def send_due_preemptions(rt: Runtime) -> int:
    """Send ``allocation.preempt`` for every preemption whose grace period has ended; returns how many."""
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="scheduler.preemptions") as uow:
        due = await pending.due_preemptions(uow.conn)
        for p in due:
            await uow.emit("allocation.preempt", PreemptAllocation(
                allocation_id=p["victim"], tenant_id=p["victim_tenant"], reason=p["reason"],
                preempted_for=p["preemptor"]), correlation_id=str(p["victim"]), tenant_id=p["victim_tenant"])
            await pending.mark_sent(uow.conn, p["victim"])
    if due:
        log.info("scheduler.preemptions_sent", victims=[str(p["victim"]) for p in due])
    return len(due)


async def preemption_loop(rt: Runtime, leadership: Leadership, every_s: float) -> None:
    await while_leading(leadership, every_s, partial(send_due_preemptions, rt))


async def publish_stats(rt: Runtime, active: ActiveScheduler) -> None:
    """Update the utilisation/fragmentation gauges and emit ``scheduler.scheduling_stats``."""
    sched = active.sched
    if sched is None:
        return
    util = sched.inv.utilisation()
    frag = sched.inv.fragmentation()
    for (pool, model), (used, total) in util.items():
        UTILISATION.labels(pool, model).set(used / total if total else 0.0)
    for (pool, model), share in frag.items():
        FRAGMENTATION.labels(pool, model).set(share)
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="scheduler.stats") as uow:
        total = await pending.preemptions_total(uow.conn)
        await uow.emit("scheduler.scheduling_stats", c.SchedulingStats(
            at=utcnow(), pending={str(t): n for t, n in sched.queue.pending().items()},
            utilisation={f"{p}/{m}": [u, t] for (p, m), (u, t) in util.items()},
            fragmentation={f"{p}/{m}": round(f, 4) for (p, m), f in frag.items()},
            preemptions_total=total), correlation_id="scheduler-stats")


async def publish_quota_use(rt: Runtime) -> int:
    """Send ``quota_changed`` for every quota whose use changed since it was last sent. Reservations and
    releases do not send one each: at hundreds of decisions a second that doubled the events per decision;
    coalesced, a quota's use is published at most once per period."""
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="scheduler.quota_use") as uow:
        rows = await catalog.unpublished_quotas(uow.conn)
        if rows:
            await uow.emit_many([("scheduler.quota_changed", c.QuotaChanged(**catalog.quota_document(r)), None)
                                 for r in rows], correlation_id="scheduler-quota-use")
    return len(rows)


async def quota_use_loop(rt: Runtime, leadership: Leadership, every_s: float) -> None:
    await while_leading(leadership, every_s, partial(publish_quota_use, rt))


async def tick(rt: Runtime, active: ActiveScheduler) -> int:
    """Re-evaluate the queue without an event: after a takeover (the placements a crashed leader had not
    claimed), and as time passes (a request that waited ``aging_s`` reserves a node). Returns how many
    requests it placed."""
    async with rt.consumers.exclusive:   # never between a batch's decisions and its commit
        sched = active.sched
        if sched is None or not len(sched.queue):
            return 0
        placed = sched.tick()
        if placed:
            try:
                async with UnitOfWork.begin(rt.pool, rt.outbox, name="scheduler.queue_tick") as uow:
                    await settle(uow, active, placed)
            except Exception:
                active.needs_reload = True
                raise
        return len(placed)


async def tick_loop(rt: Runtime, active: ActiveScheduler, leadership: Leadership, every_s: float) -> None:
    await while_leading(leadership, every_s, partial(tick, rt, active))


async def stats_loop(rt: Runtime, active: ActiveScheduler, leadership: Leadership, every_s: float) -> None:
    await while_leading(leadership, every_s, partial(publish_stats, rt, active))
