"""The reconciler's part in a node lost with its host: bring it back into the cluster's scheduler once its
allocation is ACTIVE again on another node (handlers/node_loss.py says when).

While any node is ``lost`` the cluster's scale step waits: its scheduler still lists the node and nothing is known
of where it will be. Once none is lost, each ``rejoining`` node (the controller's first) is handed to the driver's
``replace_node`` in its new slot, then is ``ready``. A driver that cannot move a node (a permanent error: a Ray
head) fails the cluster, saying so; its other nodes are released.
"""
from __future__ import annotations

import structlog

from ..adapters.repository import PgJobs
from ..domain.clusters import AWAY, Cluster
from ..domain.runtime import ClusterError, ClusterHandle, ClusterNode, ClusterRuntime, ClusterSpec
from .specs import handle_doc, handle_of, node_of, spec_of

log = structlog.get_logger()
IN_SCHEDULER = ("ready", "draining", "rejoining")     # the nodes the cluster's scheduler has in its configuration


async def replace(runtime: ClusterRuntime, spec: ClusterSpec, handle: ClusterHandle,
                  node: ClusterNode) -> ClusterHandle:
    """``replace_node`` where the driver has it, else ``set_nodes`` (a driver written before it)."""
    method = getattr(runtime, "replace_node", None)
    if method is None:
        return await runtime.set_nodes(spec, handle)
    return await method(spec, handle, node)


async def recover(rec, cl: Cluster) -> bool:
    """One recovery step of a ``scaling`` cluster; True while a node is away (the scale step then waits)."""
    away = [m for m in cl.live_members if m.state in AWAY]
    if not away:
        return False
    if any(m.state == "lost" for m in away):
        return True
    runtime, handle = rec.runtimes[cl.kind], handle_of(cl)
    back = {}
    for m in sorted(away, key=lambda x: x.idx):
        spec = spec_of(cl, [x for x in cl.live_members if x.state in IN_SCHEDULER], netns=rec.netns)
        try:
            handle = await replace(runtime, spec, handle, node_of(cl, m, netns=rec.netns))
            await _requeue(rec, runtime, handle, cl, cl.node_name(m))
        except ClusterError as exc:
            if not exc.permanent:
                raise
            await rec._write(cl.id, _failed(cl.node_name(m), str(exc)))
            return True
        back[m.allocation_id] = m.address
        log.info("paas.node_replaced", cluster_id=str(cl.id), node=cl.node_name(m), address=m.address)

    async def change(c: Cluster, _uow) -> bool:
        if c.state != "scaling":
            return False
        c.handle = handle_doc(handle)
        for m in c.live_members:
            if m.state == "rejoining" and back.get(m.allocation_id) == m.address:
                m.state = "ready"
                c.reason = f"node {c.node_name(m)} back in service after it was lost ({m.reason})"
        if c.settled and not any(m.state in ("placing", "provisioning", "releasing") for m in c.members):
            c.state = "ready"
        return True
    await rec._write(cl.id, change)
    return True


async def _requeue(rec, runtime: ClusterRuntime, handle: ClusterHandle, cl: Cluster, node: str) -> None:
    """The jobs shown requeued for the node's loss, run again where the scheduler ended them instead (a Slurm
    batch script sees its step on the lost node killed and may fail before slurmctld notices the node down)."""
    method = getattr(runtime, "requeue", None)
    if method is None:
        return
    async with rec.begin() as uow:
        ids = await PgJobs(uow.conn).requeued_by_loss(cl.id, node)
    if ids:
        again = await method(handle, ids)
        log.info("paas.jobs_requeued", cluster_id=str(cl.id), node=node, jobs=again)


def _failed(name: str, why: str):
    async def change(c: Cluster, _uow) -> bool:
        if c.state != "scaling":
            return False
        c.state, c.reason = "deleting", f"node {name} was lost and could not be brought back: {why}"
        return True
    return change


def on_away_node(cl: Cluster, job: dict) -> bool:
    """The job ran on a node that is away: its fate is already shown (node_loss), and the scheduler's own view of
    it is behind until the node is replaced."""
    away = {cl.node_name(m) for m in cl.live_members if m.state in AWAY}
    return bool(away & set(job.get("nodes") or ()))
