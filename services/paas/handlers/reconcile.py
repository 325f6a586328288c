"""The reconciler: the slow work on each cluster's own scheduler, out of any transaction, one replica at a time.

Clusters (``clusters_step``):
- ``starting`` (every first node ACTIVE with its address): start the scheduler on them → ``ready``;
- ``scaling``: new nodes ACTIVE → joined (``set_nodes``); nodes to remove → drained in the cluster's scheduler
  (Slurm DRAIN, then *drained*, never merely draining), taken out (``set_nodes``), then their allocations released;
  when nothing is in flight → ``ready``;
- ``deleting``: the scheduler stopped, then every node's allocation released (a node still provisioning is
  released once ACTIVE).
Jobs (``jobs_step``): SUBMITTING → submitted to the scheduler (its job id kept; a refusal no retry fixes is
REJECTED with the scheduler's words); PENDING/RUNNING/CANCELLING → followed (and cancelled) to their end.

A driver call that fails is logged and tried again on the next step; the state is written in a short transaction
after the call, under the row's lock, only if the row still says what the call was made for.
"""
from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import structlog

from services.allocation import contracts as ac
from shared.envelope import utcnow
from shared.unit_of_work import UnitOfWork

from ..adapters.repository import PgClusters, PgJobs
from ..domain.clusters import Cluster
from ..domain.jobs import IllegalTransition, Lifecycle, runtime_command
from ..domain.runtime import ClusterError, ClusterRuntime, JobSpec
from . import clusters as cluster_handlers
from . import jobs as job_handlers
from .recover import on_away_node, recover
from .specs import handle_doc, handle_of, spec_of

log = structlog.get_logger()
Runtimes = Mapping[str, ClusterRuntime]


class Reconciler:
    def __init__(self, begin, runtimes: Runtimes, *, netns: bool, read) -> None:
        """``begin``: a unit of work; ``read``: a connection for what the steps only read every pass (the work
        lists, each cluster and job before acting): no transaction, whose BEGIN and COMMIT would be two more
        round trips (each statement sees what was committed before it either way)."""
        self.begin, self.runtimes, self.netns, self.read = begin, runtimes, netns, read

    async def _load(self, cluster_id) -> Cluster | None:
        async with self.read() as conn:
            return await PgClusters(conn).get(cluster_id)

    async def _write(self, cluster_id, change) -> None:
        """Apply ``change(cluster, uow)`` under the cluster's lock and publish it (if it returns True)."""
        async with self.begin() as uow:
            cl = await PgClusters(uow.conn).get(cluster_id, lock=True)
            if cl is not None and await change(cl, uow):
                await cluster_handlers.publish(uow, cl)

    # ---- clusters
    async def clusters_step(self) -> None:
        async with self.read() as conn:
            ids = await PgClusters(conn).working()
        for cid in ids:
            cl = await self._load(cid)
            if cl is None:
                continue
            try:
                await {"starting": self._start, "scaling": self._scale, "deleting": self._delete}[cl.state](cl)
            except ClusterError as exc:
                await self._fail(cl, str(exc), permanent=exc.permanent)

    async def _fail(self, cl: Cluster, reason: str, *, permanent: bool) -> None:
        log.warning("paas.cluster_driver_failed", cluster_id=str(cl.id), state=cl.state, reason=reason)
        if not permanent:
            return

        async def change(c: Cluster, _uow) -> bool:
            if c.state == "starting":            # the scheduler cannot start on these nodes: give them back
                c.state, c.reason = "deleting", f"the {c.kind} cluster could not start: {reason}"
            else:
                c.reason = reason
            return True
        await self._write(cl.id, change)

    async def _start(self, cl: Cluster) -> None:
        runtime = self.runtimes[cl.kind]
        handle = await runtime.start(spec_of(cl, cl.live_members, netns=self.netns))

        async def change(c: Cluster, _uow) -> bool:
            if c.state != "starting":
                return False
            c.handle, c.driver, c.state, c.reason = handle_doc(handle), handle.driver, "ready", None
            for m in c.live_members:
                m.state = "ready"
            c.state = "scaling" if not c.settled else "ready"
            return True
        await self._write(cl.id, change)
        log.info("paas.cluster_started", cluster_id=str(cl.id), kind=cl.kind, nodes=len(cl.live_members))

    async def _scale(self, cl: Cluster) -> None:
        if await recover(self, cl):          # a node lost with its host comes first
            return
        runtime, handle = self.runtimes[cl.kind], handle_of(cl)
        joining = [m for m in cl.live_members if m.state == "active" and m.address]
        draining = [m for m in cl.live_members if m.state == "draining"]
        for m in draining:
            await runtime.drain(handle, cl.node_name(m), "scale-in")
        drained = set()
        if draining:
            states = {n.name: n for n in await runtime.nodes(handle)}
            drained = {m.allocation_id for m in draining
                       if (n := states.get(cl.node_name(m))) is None or n.state == "drained"}
        staying = [m for m in cl.live_members if m.state == "ready" or m in joining or
                   (m.state == "draining" and m.allocation_id not in drained)]
        # a node lost and not replaced (its allocation failed) is still in the scheduler: take it out
        gone = set(handle.details.get("nodes", ())) - {cl.node_name(m) for m in cl.live_members}
        if joining or drained or gone:
            handle = await runtime.set_nodes(spec_of(cl, staying, netns=self.netns), handle)

        joined = {j.allocation_id for j in joining}

        async def change(c: Cluster, uow: UnitOfWork) -> bool:
            if c.state != "scaling":
                return False
            before = (c.handle, [m.state for m in c.members])
            c.handle = handle_doc(handle)
            for m in c.live_members:
                if m.allocation_id in joined and m.state == "active":
                    m.state = "ready"
                elif m.allocation_id in drained and m.state == "draining":
                    m.state = "releasing"
                    await self._release(uow, c, m)
            if c.settled and not any(m.state in ("placing", "provisioning", "releasing") for m in c.members):
                c.state, c.reason = "ready", c.reason if gone else None
            return (c.handle, [m.state for m in c.members]) != before or c.state != "scaling"
        await self._write(cl.id, change)

    async def _delete(self, cl: Cluster) -> None:
        if cl.handle:
            await self.runtimes[cl.kind].stop(handle_of(cl))

        async def change(c: Cluster, uow: UnitOfWork) -> bool:
            if c.state != "deleting":
                return False
            before = (c.handle, [m.state for m in c.members])
            c.handle = None
            for m in c.members:
                if m.state in ("active", "joining", "ready", "draining", "lost", "rejoining"):
                    m.state = "releasing"
                    await self._release(uow, c, m)
            if c.gone:
                c.state = "deleted" if not c.reason else "failed"
            return (c.handle, [m.state for m in c.members]) != before or c.state != "deleting"
        await self._write(cl.id, change)

    @staticmethod
    async def _release(uow: UnitOfWork, cl: Cluster, m) -> None:
        if m.adopted:   # the tenant held it before the cluster: it leaves the cluster, its allocation stays ACTIVE
            m.state = "returned"
            return
        await uow.emit("allocation.release", ac.ReleaseAllocation(
            allocation_id=m.allocation_id, tenant_id=cl.tenant_id, requested_by=cl.user_id),
            correlation_id=str(cl.id), tenant_id=cl.tenant_id)

    # ---- jobs
    async def jobs_step(self) -> None:
        async with self.read() as conn:
            ids = await PgJobs(conn).live()
        clusters: dict = {}
        for jid in ids:
            async with self.read() as conn:
                job = await PgJobs(conn).get(jid)
            if job is None:
                continue
            cid = job["cluster_id"]
            if cid not in clusters:
                clusters[cid] = await self._load(cid)
            cl = clusters[cid]
            if cl is None or not cl.handle or on_away_node(cl, job):
                continue
            try:
                await self._follow(cl, job)
            except ClusterError as exc:
                if exc.permanent:
                    await self._job_write(jid, lambda j, e=exc: _end(j, "REJECTED" if j["external_id"] is None
                                                                     else "FAILED", str(e)))
                else:
                    log.warning("paas.job_driver_failed", job_id=str(jid), reason=str(exc))

    async def _follow(self, cl: Cluster, job: dict) -> None:
        runtime, handle = self.runtimes[cl.kind], handle_of(cl)
        if job["state"] == "SUBMITTING":
            spec = job["spec"]
            external = await runtime.submit(handle, JobSpec(
                job_id=job["id"], name=job["name"], command=runtime_command(job_handlers.request_of_spec(job)),
                tasks=spec["tasks"], gpus_per_task=spec["gpus_per_task"], time_limit_s=spec["time_limit_s"],
                env=dict(spec["env"]), image=spec.get("image")))
            await self._job_write(job["id"], lambda j: _submitted(j, external))
            return
        if job["state"] == "CANCELLING":
            await runtime.cancel(handle, job["external_id"])
        status = await runtime.job(handle, job["external_id"])
        await self._observation(job, status)

    async def _observation(self, read: dict, status) -> None:
        """Apply what the scheduler said of the job as it was ``read``. Not when something wrote the job since
        (a cancel, a requeue after its node was lost: the observation may predate it), nor while a node it ran on
        is away (the scheduler's view is behind until the node is replaced); the next pass looks again."""
        async with self.begin() as uow:
            job = await PgJobs(uow.conn).get(read["id"], lock=True)
            if job is None or job["version"] != read["version"]:
                return
            nodes_before = {**job, "nodes": list(job["nodes"])}
            if not _observed(job, status):                   # nothing new: nothing to check or write
                return
            cl = await PgClusters(uow.conn).get(job["cluster_id"])
            if cl is None or on_away_node(cl, nodes_before) or on_away_node(cl, job):
                return
            await job_handlers.publish(uow, job)

    async def _job_write(self, job_id, change) -> None:
        async with self.begin() as uow:
            job = await PgJobs(uow.conn).get(job_id, lock=True)
            if job is not None and change(job):
                await job_handlers.publish(uow, job)


def _submitted(job: dict, external: str) -> bool:
    if job["state"] not in ("SUBMITTING", "CANCELLING"):
        return False
    job["external_id"] = external
    if job["state"] == "SUBMITTING":
        job["state"] = "PENDING"
    return True


def _observed(job: dict, status) -> bool:
    try:
        nxt = Lifecycle(job["state"], job["reason"] or "").observed(status.state, status.message)
    except IllegalTransition:
        return False
    changed = nxt.state != job["state"] or list(status.nodes) != list(job["nodes"])
    if not changed:
        return False
    job["state"], job["nodes"] = nxt.state, list(status.nodes)
    job["reason"] = status.message or job["reason"]
    if status.started_at and job["started_at"] is None:
        job["started_at"] = datetime.fromtimestamp(status.started_at, UTC)
    if nxt.final:
        job["exit_code"] = status.exit_code
        job["ended_at"] = datetime.fromtimestamp(status.ended_at, UTC) if status.ended_at else utcnow()
    return True


def _end(job: dict, state: str, reason: str) -> bool:
    if job["state"] not in ("SUBMITTING", "PENDING", "RUNNING", "CANCELLING"):
        return False
    job["state"], job["reason"], job["ended_at"] = state, reason[:2000], utcnow()
    return True
