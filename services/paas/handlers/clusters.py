"""Cluster commands (create, scale, delete) and what the scheduler, the allocations and the network say of its nodes.

Every change is answered with ``paas.cluster_changed`` (the whole cluster, its version grown). The slow work on
the cluster's scheduler (start it, add or drain nodes, stop it) is the reconciler's (handlers/reconcile.py), out
of these transactions: a handler only records what should happen next.
"""
from __future__ import annotations

import uuid

import structlog

from services.scheduler import contracts as sc
from shared.envelope import utcnow
from shared.refusals import PermanentError
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.repository import PgClusters
from ..domain.clusters import Cluster, Member

log = structlog.get_logger()


async def publish(ctx: UnitOfWork, cl: Cluster, *, new: bool = False) -> None:
    """Store the cluster (its version grown) and announce it whole."""
    cl.updated_at = utcnow()
    repo = PgClusters(ctx.conn)
    if new:
        cl.version = 1
        await repo.insert(cl)
    else:
        await repo.save(cl)
    await ctx.emit("paas.cluster_changed", view(cl), correlation_id=str(cl.id), tenant_id=cl.tenant_id)


def view(cl: Cluster) -> c.ClusterChanged:
    return c.ClusterChanged(
        cluster_id=cl.id, tenant_id=cl.tenant_id, name=cl.name, kind=cl.kind, shape=cl.shape, gpu_count=cl.gpu_count,
        node_count=cl.node_count, network_id=cl.network_id, state=cl.state, reason=cl.reason, driver=cl.driver,
        controller=(cl.handle or {}).get("controller"), autoscaling=cl.autoscaling, spot=cl.spot,
        version=cl.version, created_at=cl.created_at, updated_at=cl.updated_at,
        nodes=[c.ClusterNodeView(name=cl.node_name(m), allocation_id=m.allocation_id, state=m.state, address=m.address,
                                 adopted=m.adopted)
               for m in cl.members])


async def _reserve(ctx: UnitOfWork, cl: Cluster, members: list[Member], requested_by: str) -> None:
    await ctx.emit("scheduler.reserve_gang", _gang_command(cl, members, requested_by), correlation_id=str(cl.id),
                   tenant_id=cl.tenant_id)


def _gang_command(cl: Cluster, members: list[Member], requested_by: str):
    return sc.ReserveGang(gang_id=members[0].gang_id, tenant_id=cl.tenant_id, user_id=cl.user_id, shape=cl.shape,
                          gpu_count=cl.gpu_count, pool=cl.pool, tolerations=list(cl.tolerations),
                          priority=cl.priority, spot=cl.spot,
                          members=[m.allocation_id for m in members], requested_by=requested_by[:200])


async def create_cluster(ctx: UnitOfWork, cmd: c.CreateCluster) -> None:
    """Record the cluster and ask the scheduler to place its nodes as one gang, or, with ``members``, make it of
    those allocations of the tenant (``_adopt``). Idempotent on the cluster id; a name the tenant already uses makes
    a failed cluster saying so."""
    repo = PgClusters(ctx.conn)
    existing = await repo.get(cmd.cluster_id, lock=True)
    if existing is not None:
        if existing.tenant_id != cmd.tenant_id:
            raise PermanentError(f"cluster id {cmd.cluster_id} is in use; choose another")
        return
    now = utcnow()
    cl = Cluster(cmd.cluster_id, cmd.tenant_id, cmd.user_id, cmd.name, cmd.kind, cmd.shape, cmd.gpu_count,
                 cmd.node_count, cmd.network_id, cmd.pool, cmd.priority, cmd.spot,
                 cmd.autoscaling.model_dump() if cmd.autoscaling else None, "placing", now, now, version=0,
                 tolerations=list(cmd.tolerations))
    if await repo.name_taken(cmd.tenant_id, cmd.name):
        cl.state, cl.reason = "failed", f"a cluster named {cmd.name!r} exists already"
        return await publish(ctx, cl, new=True)
    if cmd.members:
        return await _adopt(ctx, cl, cmd.members)
    members = cl.add_gang(cmd.node_count)
    await publish(ctx, cl, new=True)
    await _reserve(ctx, cl, members, cmd.requested_by)


async def _adopt(ctx: UnitOfWork, cl: Cluster, adopted: list[c.AdoptedMember]) -> None:
    """A cluster of allocations the tenant holds (the gateway checked them: ACTIVE, one network, one shape): its
    members are ``active`` with their addresses, so it is ``starting`` at once; no gang, no allocation requested.
    One already a live node of another cluster fails it, saying so (the gateway refuses that up front; this is
    the race it cannot see)."""
    taken = await PgClusters(ctx.conn).live_memberships([m.allocation_id for m in adopted])
    if taken:
        allocation, other = next(iter(taken.items()))
        cl.state, cl.reason = "failed", f"allocation {allocation} is a node of cluster {other} already"
    else:
        cl.adopt([(m.allocation_id, m.node_id, m.attachment_id, m.address) for m in adopted])
    await publish(ctx, cl, new=True)


async def _owned(ctx: UnitOfWork, cluster_id: uuid.UUID, tenant_id: uuid.UUID) -> Cluster:
    cl = await PgClusters(ctx.conn).get(cluster_id, lock=True)
    if cl is None or cl.tenant_id != tenant_id:
        raise PermanentError(f"cluster {cluster_id} not found")
    return cl


async def scale_cluster(ctx: UnitOfWork, cmd: c.ScaleCluster) -> None:
    """Grow (a new gang) or shrink (drain the highest-numbered nodes, then release them) to ``node_count``. Refused on
    the cluster (``reason``) while another change is in flight or the cluster is not ready."""
    cl = await _owned(ctx, cmd.cluster_id, cmd.tenant_id)
    await scale(ctx, cl, cmd.node_count, cmd.requested_by)


async def scale(ctx: UnitOfWork, cl: Cluster, count: int, requested_by: str, *, reason: str | None = None) -> None:
    """Move a ready cluster towards ``count`` nodes (``reason``: why, shown on the cluster)."""
    live = len(cl.live_members)
    if cl.state != "ready" or not cl.settled:
        cl.reason = f"cannot scale while the cluster is {cl.state}; try again when it is ready"
        return await publish(ctx, cl)
    cl.node_count, cl.reason = count, reason
    if count > live:
        cl.state = "scaling"
        new = cl.add_gang(count - live)
        await publish(ctx, cl)
        return await _reserve(ctx, cl, new, requested_by)
    if count < live:
        cl.state = "scaling"
        cl.shrink_to(count)
    await publish(ctx, cl)


async def delete_cluster(ctx: UnitOfWork, cmd: c.DeleteCluster) -> None:
    """Mark the cluster deleting: the reconciler stops its scheduler, then its allocations are released (an
    adopted one is returned to the tenant as it is, never released). A gang still waiting in the scheduler's queue
    is withdrawn."""
    cl = await _owned(ctx, cmd.cluster_id, cmd.tenant_id)
    if cl.state in ("deleting", "deleted"):
        return
    waiting = {m.gang_id for m in cl.members if m.state == "placing"}
    for gang in waiting:
        await ctx.emit("scheduler.cancel_gang", sc.CancelGang(gang_id=gang, tenant_id=cl.tenant_id,
                                                              requested_by=cmd.requested_by[:200]),
                       correlation_id=str(cl.id), tenant_id=cl.tenant_id)
    cl.state, cl.reason = "deleting", None
    await publish(ctx, cl)


async def refused(ctx: UnitOfWork, cmd, reason: str) -> None:
    """A cluster command no retry can fix: shown on the cluster when it is the tenant's, else logged."""
    cl = await PgClusters(ctx.conn).get(cmd.cluster_id, lock=True)
    if cl is not None and cl.tenant_id == cmd.tenant_id:
        cl.reason = reason
        return await publish(ctx, cl)
    log.warning("paas.command_refused", cluster_id=str(cmd.cluster_id), reason=reason)
