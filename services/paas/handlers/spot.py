"""A pool's spot offering, live: the provider admin's command, the scheduler's figures and notices, and what
becomes of the offering's allocations (``domain.offering`` decides; this module stores, publishes and sends).

- ``paas.set_spot_offering``: enable or change the offering, or disable it (every node reclaimed with notice);
- ``scheduler.scheduling_stats``: the pool's free GPUs and spot reserve: grow (``allocation.request`` of spot
  allocations of the provider's spot tenant) or reclaim;
- ``scheduler.preemption_notice`` for a spot node: a tenant's request takes it; the market is told at once;
- a spot node ACTIVE, released or failed (``nodes.py`` hands these over first): offered; gone.

The market (the spot-capacity driver) is told by ``SpotMarket.step`` on the leader, out of any transaction.
"""
from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import structlog

from services.allocation import contracts as ac
from services.scheduler import contracts as sc
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.spot_store import SpotStore
from ..domain import offering as dom
from ..domain.offering import Offering, SpotNode

log = structlog.get_logger()
DRIVER = "recording"
LABEL = "tessera.spot.offering"


def _at(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, UTC) if t is not None else None


def node_name(node: SpotNode, pool: str) -> str:
    """The node's name, in the tenant's allocations and in the market."""
    return f"spot-{pool}-{node.allocation_id.hex[:8]}"[:63]


def view(off: Offering, now: float) -> c.SpotOfferingChanged:
    nodes = sorted(off.nodes, key=lambda n: (not n.live, -(n.ended_at or 0.0), n.requested_at))
    return c.SpotOfferingChanged(
        pool=off.pool, enabled=off.enabled, tenant_id=off.tenant_id, shape=off.shape, gpu_count=off.gpu_count,
        max_nodes=off.max_nodes, headroom_gpus=off.headroom_gpus, notice_s=off.notice_s, cluster_name=off.cluster_name,
        driver=DRIVER, offered_gpus=off.offered_gpus, offered_gpu_s=round(off.held_gpu_s(now), 3),
        reclaims_total=off.reclaims_total, market_usage=off.market_usage, free_gpus=off.free_gpus,
        reserve_gpus=off.reserve_gpus, reason=off.reason,
        version=off.version, updated_at=_at(now),
        nodes=[c.SpotNodeView(allocation_id=n.allocation_id, state=n.state, node_id=n.node_id, gpus=n.gpus,
                              requested_at=_at(n.requested_at), offered_at=_at(n.offered_at),
                              reclaim_by=_at(n.reclaim_by), reclaim_reason=n.reclaim_reason, ended_at=_at(n.ended_at))
               for n in nodes])


async def publish(ctx: UnitOfWork, off: Offering, now: float) -> None:
    """Store the offering (its version grown) and announce it whole."""
    await SpotStore(ctx.conn).save(off)
    await ctx.emit("paas.spot_offering_changed", view(off, now), correlation_id=f"spot:{off.pool}")


async def set_spot_offering(ctx: UnitOfWork, cmd: c.SetSpotOffering) -> None:
    now = time.time()
    off = await SpotStore(ctx.conn).get(cmd.pool, lock=True)
    if not cmd.enabled:
        if off is None:
            return
        dom.disable(off, now)
        off.reason = f"disabled by {cmd.requested_by}"
        return await publish(ctx, off, now)
    fields = dict(tenant_id=cmd.tenant_id, user_id=cmd.user_id, shape=cmd.shape, gpu_count=cmd.gpu_count,
                  gpu_model=cmd.gpu_model or "GPU",
                  max_nodes=cmd.max_nodes, headroom_gpus=cmd.headroom_gpus, notice_s=cmd.notice_s,
                  tolerations=list(cmd.tolerations), group=cmd.group, region=cmd.region)
    if off is None:
        off = Offering(pool=cmd.pool, cluster_name=cmd.cluster_name, **fields)
    elif off.live and (off.tenant_id != cmd.tenant_id or off.cluster_name != cmd.cluster_name):
        off.reason = (f"refused: the offering still holds {len(off.live)} node(s) of tenant {off.tenant_id} in market "
                      f"cluster {off.cluster_name}; disable it and wait for them to go first")
        return await publish(ctx, off, now)
    else:
        vars(off).update(fields, cluster_name=cmd.cluster_name)
    off.enabled, off.reason = True, f"enabled by {cmd.requested_by}"
    await publish(ctx, off, now)


async def refused(ctx: UnitOfWork, cmd, reason: str) -> None:
    """A spot command no retry can fix: shown on the offering when there is one, else logged."""
    off = await SpotStore(ctx.conn).get(cmd.pool, lock=True)
    if off is None:
        log.warning("paas.spot_command_refused", pool=cmd.pool, reason=reason)
        return
    off.reason = f"refused: {reason}"
    await publish(ctx, off, time.time())


def _pool_free(stats: sc.SchedulingStats, pool: str) -> int:
    return sum(total - used for key, (used, total) in stats.utilisation.items() if key.split("/", 1)[0] == pool)


async def on_stats(ctx: UnitOfWork, stats: sc.SchedulingStats) -> None:
    """The scheduler's periodic figures: each enabled offering grows into its pool's spare GPUs or gives back
    what the pool's reserve needs."""
    now = time.time()
    for off in await SpotStore(ctx.conn).working(lock=True):
        before = (off.free_gpus, off.reserve_gpus)
        decision = dom.decide(off, free=_pool_free(stats, off.pool), reserve=stats.spot_reserve.get(off.pool, 0),
                              figures_at=stats.at.timestamp())
        new = dom.grow(off, decision.grow, now)
        for node in decision.reclaim:
            dom.reclaim(off, node, now, by=now + off.notice_s, release_due=True,
                        reason=f"tenants may claim {off.reserve_gpus} GPU(s) of the pool, {off.free_gpus} are free")
        if new:
            await ctx.emit_many([("allocation.request", _request(off, n), None) for n in new],
                                correlation_id=f"spot:{off.pool}", tenant_id=off.tenant_id)
        if new or decision.reclaim or before != (off.free_gpus, off.reserve_gpus):
            await publish(ctx, off, now)


def _request(off: Offering, node: SpotNode) -> ac.RequestAllocation:
    return ac.RequestAllocation(
        allocation_id=node.allocation_id, tenant_id=off.tenant_id, user_id=off.user_id,
        name=node_name(node, off.pool), shape=off.shape, gpu_count=off.gpu_count, volume_gb=0,
        spot=True, pool=off.pool, tolerations=list(off.tolerations), labels={LABEL: off.pool})


async def on_preemption_notice(ctx: UnitOfWork, evt: sc.PreemptionNotice) -> None:
    """A tenant's request preempts a spot node: it is being reclaimed, and the scheduler releases it at the end
    of its grace period."""
    off = await SpotStore(ctx.conn).of_node(evt.allocation_id)
    node = off.node(evt.allocation_id) if off else None
    if node is None:
        return
    now = time.time()
    if dom.reclaim(off, node, now, by=evt.grace_deadline.timestamp(), release_due=False,
                   reason=f"preempted by the scheduler: {evt.reason}"):
        await publish(ctx, off, now)


async def _node_changed(ctx: UnitOfWork, allocation_id: uuid.UUID, change) -> bool:
    off = await SpotStore(ctx.conn).of_node(allocation_id)
    node = off.node(allocation_id) if off else None
    if node is None:
        return off is not None
    now = time.time()
    change(off, node, now)
    await publish(ctx, off, now)
    return True


async def activated(ctx: UnitOfWork, allocation_id: uuid.UUID, node_id: uuid.UUID) -> bool:
    """Whether the allocation is a spot node (then handled here: it is offered)."""
    return await _node_changed(ctx, allocation_id, lambda off, node, now: dom.activated(off, node, node_id, now))


async def ended(ctx: UnitOfWork, allocation_id: uuid.UUID, state: str) -> bool:
    """Whether the allocation is a spot node (then handled here: its GPUs are the pool's again)."""
    return await _node_changed(ctx, allocation_id, lambda off, node, now: dom.ended(off, node, state, now))
