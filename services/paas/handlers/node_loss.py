"""A cluster's node lost with its host, and what follows (the allocations' failover, as the paas sees it).

- ``allocation.interrupted``: the member is ``lost`` (still a node of the cluster), the cluster says which node
  and why, and the jobs that ran there are requeued or failed (``domain.clusters.lost_job``);
- ``allocation.activated`` / ``allocation.rescheduled`` and ``network.network_attached`` again, in either order:
  ``Cluster.back`` makes it ``rejoining`` once both arrived; the reconciler replaces it in the scheduler;
- ``allocation.failed`` after the loss: ``Cluster.not_replaced`` (handlers/nodes.py calls it).
Messages about allocations that are no cluster's are ignored.
"""
from __future__ import annotations

from services.allocation import contracts as ac
from shared.envelope import utcnow
from shared.unit_of_work import UnitOfWork

from ..adapters.repository import PgClusters, PgJobs
from ..domain.clusters import Cluster, Member, lost_job
from ..domain.jobs import Lifecycle
from . import jobs as job_handlers
from .clusters import publish


async def interrupted(ctx: UnitOfWork, evt: ac.AllocationInterrupted) -> None:
    cl = await PgClusters(ctx.conn).of_member(evt.allocation_id)
    m = cl.member(evt.allocation_id) if cl else None
    if m is None:
        return
    why = f"{evt.category}: {evt.reason}"
    if not cl.lose(m, why):
        return
    await publish(ctx, cl)
    await _jobs_on(ctx, cl, m, why)


async def _jobs_on(ctx: UnitOfWork, cl: Cluster, m: Member, why: str) -> None:
    """Every running job of the cluster that ran on ``m``: requeued (PENDING) or FAILED, saying so. The reconciler
    leaves such a job alone while its node is away (the scheduler's own view of it is behind)."""
    jobs, name = PgJobs(ctx.conn), cl.node_name(m)
    for jid in await jobs.live_of(cl.id):
        job = await jobs.get(jid, lock=True)
        if job is None or job["state"] != "RUNNING" or name not in job["nodes"]:
            continue
        state, reason = lost_job(cl.kind, name, why)
        life = Lifecycle(job["state"], job["reason"] or "")
        life = life.requeued(reason) if state == "PENDING" else life.to(state, reason)
        job["state"], job["reason"] = life.state, life.reason
        if job["state"] == "FAILED":
            job["ended_at"] = utcnow()
        await job_handlers.publish(ctx, job)


async def active_again(ctx: UnitOfWork, cl: Cluster, m: Member, node_id) -> None:
    """A lost member ACTIVE again (``allocation.activated`` or ``allocation.rescheduled``) on ``node_id``."""
    if m.state != "lost":
        return
    m.node_id = node_id
    cl.back(m)
    await publish(ctx, cl)


async def rescheduled(ctx: UnitOfWork, evt: ac.AllocationRescheduled) -> None:
    cl = await PgClusters(ctx.conn).of_member(evt.allocation_id)
    m = cl.member(evt.allocation_id) if cl else None
    if m is not None:
        await active_again(ctx, cl, m, evt.to_node_id)


async def attached_again(ctx: UnitOfWork, cl: Cluster, m: Member, evt) -> None:
    """A lost member's new attachment (``network.network_attached`` again): its address and slot; its node is the
    allocation's word (activated), so the two can be told apart whatever their order."""
    m.address, m.attachment_id = evt.ip_address, evt.attachment_id
    cl.back(m)
    await publish(ctx, cl)
