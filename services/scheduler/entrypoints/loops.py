"""The active scheduler's periodic work and leadership: preemptions whose grace has ended, quota use, the
queue's tick, stats.

Only the leader (the kit's leadership ``scheduler``, shared.periodic) consumes commands (its subscribers are
the kit's leader-only ones) and runs the loops that act; a standby waits on the advisory lock. On gaining it,
a replica loads the index from PostgreSQL and announces the catalog before it consumes; when it loses it, the
subscribers stop and the index is dropped. With election off every replica leads, guarded by SQL alone.
Every transaction here is a ``UnitOfWork``.
"""
from __future__ import annotations

from functools import partial

import structlog

from services.allocation.contracts import PreemptAllocation
from shared.envelope import utcnow
from shared.periodic import Leadership
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters import catalog
from ..adapters import health as health_store
from ..adapters import queue as pending
from ..adapters.metrics import FRAGMENTATION, LEADER, UTILISATION
from ..domain.health import DEFAULT_POLICY
from ..handlers import ActiveScheduler
from ..handlers.health import HealthMonitor, evaluate, on_heartbeat
from ..handlers.placing import settle
from ..settings import SchedulerSettings

log = structlog.get_logger()


def wire(rt: Runtime, active: ActiveScheduler, settings: SchedulerSettings, monitor: HealthMonitor) -> Leadership:
    """Register the leadership (what a replica does as it gains and loses it) and the leader's loops;
    returns the leadership (tests and the benchmark watch its ``leading``). Every replica listens to the
    heartbeats; the leader judges them (handlers/health.py)."""
    lead = rt.leader("scheduler", elect=settings.leader_election)
    rt.listen("node_agent.heartbeat", partial(on_heartbeat, monitor=monitor))

    async def gained() -> None:
        await active.load(rt.pool)
        await announce_catalog(rt)
        await announce_health_policy(rt)
        monitor.leading_since = None   # every node gets one full timeout from the first judgement on
        await rt.consumers.start_leader_only()
        LEADER.set(1)

    async def lost() -> None:
        LEADER.set(0)
        await rt.consumers.stop_leader_only()   # messages in flight finish before the index is dropped
        active.unload()

    lead.on_gain(gained)
    lead.on_lose(lost)
    rt.every(min(1.0, max(settings.preemption_grace_s / 4, 0.05)), partial(send_due_preemptions, rt),
             leader="scheduler", at_once=True)
    rt.every(settings.stats_s, partial(publish_stats, rt, active), leader="scheduler", at_once=True)
    rt.every(1.0, partial(publish_quota_use, rt), leader="scheduler", at_once=True)
    rt.every(min(max(settings.aging_s / 4, 0.5), 5.0), partial(tick, rt, active), leader="scheduler", at_once=True)
    rt.every(settings.health_period_s, partial(evaluate, rt, active, monitor), leader="scheduler")
    return lead


async def announce_health_policy(rt: Runtime) -> int:
    """Seed the default classification of every condition the provider has not set, and publish the whole
    policy (read models ignore versions they have)."""
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="scheduler.health_policy") as uow:
        await health_store.seed_policy(uow.conn, DEFAULT_POLICY)
        rows = await health_store.policy_rows(uow.conn)
        await uow.emit_many([("scheduler.health_policy_changed", c.HealthPolicyChanged(**r), None) for r in rows],
                            correlation_id="scheduler.health_policy")
    return len(rows)


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
            preemptions_total=total, spot_reserve=sched.spot_reserve()), correlation_id="scheduler-stats")


async def publish_quota_use(rt: Runtime) -> int:
    """Send ``quota_use_changed`` for the quotas whose use changed since it was last sent, up to
    ``QUOTA_USE_PER_MESSAGE`` to a message. Reservations and releases do not send one each: at hundreds of
    decisions a second that doubled the events per decision; coalesced, a quota's use is published at most once
    per period, and a thousand tenants' changes are a handful of messages, not a thousand. Read first, marked
    last: the claims wait for no quota row while the documents are built."""
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="scheduler.quota_use") as uow:
        rows = await catalog.unpublished_quotas(uow.conn)
        if rows:
            docs = [c.QuotaChanged(**catalog.quota_document(r)) for r in rows]
            step = c.QUOTA_USE_PER_MESSAGE
            await uow.emit_many([("scheduler.quota_use_changed", c.QuotaUseChanged(quotas=docs[i:i + step]), None)
                                 for i in range(0, len(docs), step)], correlation_id="scheduler-quota-use")
            await catalog.mark_published(uow.conn, rows)   # the rows' locks only from here to the commit
    return len(rows)



async def tick(rt: Runtime, active: ActiveScheduler) -> int:
    """Re-evaluate the queue without an event: after a takeover (the placements a crashed leader had not
    claimed), and as time passes (a request that waited ``aging_s`` reserves a node). Returns how many
    requests it placed."""
    async with rt.consumers.exclusive:   # never between a batch's decisions and its commit
        sched = active.sched
        if sched is None or not len(sched.queue):
            return 0
        placed = sched.tick()
        if placed or sched.placed_gangs:
            try:
                async with UnitOfWork.begin(rt.pool, rt.outbox, name="scheduler.queue_tick") as uow:
                    await settle(uow, active, placed)
            except Exception:
                active.needs_reload = True
                raise
        return len(placed)   # gangs are claimed and answered with them (settle)
