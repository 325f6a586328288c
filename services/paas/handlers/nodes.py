"""What the scheduler, the allocations and the network say of a cluster's nodes.

- a gang placed: each member is requested through the ordinary allocate saga (``allocation.request``, the
  member's allocation id: a redelivery requests the same allocation, which the allocation service answers once);
- a gang queued: the cluster waits (``queued``), holding no GPU; a gang refused: the first gang fails the cluster,
  a scale step's leaves it ready, saying why;
- the network attached a member: its address on the tenant network (and where its slot is);
- a member ACTIVE: once every live member is, the reconciler starts (or grows) the cluster's scheduler;
- a member FAILED or RELEASED: a first node failing fails the cluster and releases the rest; the last release of
  a deleting cluster makes it deleted.
A spot offering's nodes are handed to ``spot.py`` first. Messages about allocations that are no cluster's are
ignored (every allocation's events reach this consumer).
"""
from __future__ import annotations

import asyncpg

from services.allocation import contracts as ac
from services.network import contracts as nc
from shared.unit_of_work import UnitOfWork

from ..adapters.repository import PgClusters, followed
from ..domain.clusters import AWAY, Cluster, Member
from . import spot
from .clusters import publish
from .node_loss import active_again, attached_again


async def gang_placed(ctx: UnitOfWork, evt) -> None:
    cl = await PgClusters(ctx.conn).of_gang(evt.gang_id)
    if cl is None:
        return
    members = [m for m in cl.gang(evt.gang_id) if m.state == "placing"]
    if not members:
        return
    if cl.state == "deleting":     # placed after a delete: request nothing, release what the gang holds
        for m in members:
            m.state = "released"
        await publish(ctx, cl)
        return
    for m in members:
        m.state = "provisioning"
    if cl.state in ("placing", "queued"):
        cl.state, cl.reason = "provisioning", None
    await publish(ctx, cl)
    await ctx.emit_many([("allocation.request", _request(cl, m), None) for m in members],
                        correlation_id=str(cl.id), tenant_id=cl.tenant_id)


def _request(cl: Cluster, m: Member) -> ac.RequestAllocation:
    return ac.RequestAllocation(
        allocation_id=m.allocation_id, tenant_id=cl.tenant_id, user_id=cl.user_id, name=cl.node_name(m)[:63],
        shape=cl.shape, gpu_count=cl.gpu_count, volume_gb=0, priority=cl.priority, spot=cl.spot, pool=cl.pool,
        tolerations=list(cl.tolerations), network_id=cl.network_id,
        labels={"tessera.cluster": str(cl.id), "tessera.cluster.node": cl.node_name(m)})


async def gang_queued(ctx: UnitOfWork, evt) -> None:
    cl = await PgClusters(ctx.conn).of_gang(evt.gang_id)
    if cl is None or cl.state not in ("placing", "queued", "scaling"):
        return
    if cl.state != "scaling":
        cl.state = "queued"
    cl.reason = f"waiting for capacity for {len(cl.gang(evt.gang_id))} node(s) at once (position {evt.position}): " \
                f"{evt.reason}"
    await publish(ctx, cl)


async def gang_rejected(ctx: UnitOfWork, evt) -> None:
    cl = await PgClusters(ctx.conn).of_gang(evt.gang_id)
    if cl is None:
        return
    members = [m for m in cl.gang(evt.gang_id) if m.state == "placing"]
    if not members:
        return
    for m in members:
        m.state, m.reason = "failed", evt.reason
    if cl.state == "deleting":
        await _maybe_gone(cl)
    elif any(m.live for m in cl.members):          # a scale step refused: the cluster stays as it was
        cl.state, cl.node_count = "ready", len(cl.live_members)
        cl.reason = f"scale-out refused ({evt.code}): {evt.reason}"
    else:
        cl.state, cl.reason = "failed", f"{evt.code}: {evt.reason}"
    await publish(ctx, cl)


async def follows(conn: asyncpg.Connection, events: list) -> list[bool]:
    """Which of a batch of events about allocations (their ``allocation_id``) the paas follows: those of a cluster's
    nodes and of spot nodes. Every allocation's events reach it; the others are acknowledged without a transaction
    (the ``interest`` of their subscriptions). A node's row is written before its allocation is requested, so no
    event the handlers would act on is ever ignored."""
    ours = await followed(conn, [e.allocation_id for e in events])
    return [e.allocation_id in ours for e in events]


async def network_attached(ctx: UnitOfWork, evt: nc.NetworkAttached) -> None:
    cl = await PgClusters(ctx.conn).of_member(evt.allocation_id)
    m = cl.member(evt.allocation_id) if cl else None
    if m is None or not m.live:
        return
    if m.state == "lost":
        return await attached_again(ctx, cl, m, evt)
    m.address, m.attachment_id, m.node_id = evt.ip_address, evt.attachment_id, evt.node_id or m.node_id
    _maybe_start(cl)
    await publish(ctx, cl)


async def activated(ctx: UnitOfWork, evt: ac.AllocationActivated) -> None:
    if await spot.activated(ctx, evt.allocation_id, evt.node_id):
        return
    cl = await PgClusters(ctx.conn).of_member(evt.allocation_id)
    m = cl.member(evt.allocation_id) if cl else None
    if m is not None and m.state == "lost":
        return await active_again(ctx, cl, m, evt.node_id)
    if m is None or m.state != "provisioning":
        return
    m.state, m.node_id = "active", evt.node_id
    _maybe_start(cl)
    await publish(ctx, cl)


def _maybe_start(cl: Cluster) -> None:
    """Every first node ACTIVE with its address (the two arrive on different streams, in either order): start."""
    if cl.state == "provisioning" and cl.all_active:
        cl.state = "starting"


async def failed(ctx: UnitOfWork, evt: ac.AllocationFailed) -> None:
    await _ended(ctx, evt.allocation_id, "failed", getattr(evt, "reason", None) or "the allocation failed")


async def released(ctx: UnitOfWork, evt: ac.AllocationReleased) -> None:
    await _ended(ctx, evt.allocation_id, "released", None)


async def _ended(ctx: UnitOfWork, allocation_id, state: str, reason: str | None) -> None:
    if await spot.ended(ctx, allocation_id, state):
        return
    cl = await PgClusters(ctx.conn).of_member(allocation_id)
    m = cl.member(allocation_id) if cl else None
    if m is None or m.state in ("released", "failed"):
        return
    was_first = cl.state in ("provisioning", "starting")
    if state == "failed" and m.state in AWAY and cl.handle and cl.state != "deleting":
        cl.not_replaced(m, reason)
        return await publish(ctx, cl)
    m.state, m.reason = state, reason
    if cl.state == "deleting":
        await _maybe_gone(cl)
    elif was_first and state == "failed":
        cl.state, cl.reason = "deleting", f"node {cl.node_name(m)} failed: {reason}"
    elif state == "failed":
        cl.reason = f"node {cl.node_name(m)} failed: {reason}"
    await publish(ctx, cl)


async def _maybe_gone(cl: Cluster) -> None:
    if cl.gone:
        cl.state = "deleted" if not cl.reason else "failed"
