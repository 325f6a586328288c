"""Job commands: submit (checked against the tenant's job policy before anything reaches a scheduler), cancel,
and reading a job's output.

A submitted job is stored SUBMITTING; the reconciler hands it to its cluster's scheduler and follows it
(handlers/reconcile.py). A job the policy or the cluster refuses is REJECTED at once, the rules it broke in its
``reason``; nothing of it reaches the cluster.
"""
from __future__ import annotations

from typing import Any

import structlog

from shared.envelope import utcnow
from shared.refusals import PermanentError
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.repository import PgClusters, PgJobs
from ..domain.jobs import JobPolicy, JobRequest, check
from .specs import handle_of

log = structlog.get_logger()


def view(job: dict[str, Any]) -> c.JobChanged:
    spec = job["spec"]
    return c.JobChanged(job_id=job["id"], tenant_id=job["tenant_id"], user_id=job["user_id"],
                        cluster_id=job["cluster_id"], name=job["name"], state=job["state"], reason=job["reason"],
                        exit_code=job["exit_code"], external_id=job["external_id"], tasks=spec["tasks"],
                        gpus_per_task=spec["gpus_per_task"], time_limit_s=spec["time_limit_s"],
                        nodes=list(job["nodes"]), version=job["version"], submitted_at=job["submitted_at"],
                        started_at=job["started_at"], ended_at=job["ended_at"])


async def publish(ctx: UnitOfWork, job: dict[str, Any], *, new: bool = False) -> None:
    repo = PgJobs(ctx.conn)
    if new:
        job["version"] = 1
        await repo.insert(job)
    else:
        await repo.save(job)
    await ctx.emit("paas.job_changed", view(job), correlation_id=str(job["id"]), tenant_id=job["tenant_id"])


def new_job(cmd: c.SubmitJob, state: str = "SUBMITTING", reason: str | None = None) -> dict[str, Any]:
    """The job row a submit makes (its spec: the command as it arrived, less who and where)."""
    spec = cmd.model_dump(mode="json", exclude={"job_id", "tenant_id", "user_id", "cluster_id", "requested_by"})
    return {"id": cmd.job_id, "tenant_id": cmd.tenant_id, "user_id": cmd.user_id, "cluster_id": cmd.cluster_id,
            "name": cmd.name, "spec": spec, "state": state, "reason": reason, "exit_code": None, "external_id": None,
            "nodes": [], "version": 0, "submitted_at": utcnow(), "started_at": None, "ended_at": None}


async def submit_job(ctx: UnitOfWork, cmd: c.SubmitJob, *, policy: JobPolicy) -> None:
    """Store the job SUBMITTING, or REJECTED naming every rule it breaks (privileged, too many GPUs for the policy
    or the cluster, an image not allowed, a cluster that is not the tenant's or is going away). Idempotent on the
    job id."""
    jobs = PgJobs(ctx.conn)
    existing = await jobs.get(cmd.job_id)
    if existing is not None:
        if existing["tenant_id"] != cmd.tenant_id:
            raise PermanentError(f"job id {cmd.job_id} is in use; choose another")
        return
    job = new_job(cmd)
    cl = await PgClusters(ctx.conn).get(cmd.cluster_id)
    if cl is None or cl.tenant_id != cmd.tenant_id:
        raise PermanentError(f"cluster {cmd.cluster_id} not found")
    if cl.state in ("deleting", "deleted", "failed"):
        job["state"], job["reason"] = "REJECTED", f"the cluster is {cl.state}"
    else:
        gpus = cl.gpu_count * len(cl.live_members)
        violations = check(request_of_spec(job), policy, cl.kind, gpus)
        if violations:
            job["state"] = "REJECTED"
            job["reason"] = "; ".join(f"{v.field}: {v.message}" for v in violations)[:2000]
    await publish(ctx, job, new=True)


async def cancel_job(ctx: UnitOfWork, cmd: c.CancelJob) -> None:
    """Ask the job's scheduler to cancel it (the reconciler does); a finished job is left as it ended."""
    jobs = PgJobs(ctx.conn)
    job = await jobs.get(cmd.job_id, lock=True)
    if job is None or job["tenant_id"] != cmd.tenant_id:
        raise PermanentError(f"job {cmd.job_id} not found")
    if job["state"] not in ("SUBMITTING", "PENDING", "RUNNING"):
        return
    job["state"] = "CANCELLED" if job["state"] == "SUBMITTING" and job["external_id"] is None else "CANCELLING"
    if job["state"] == "CANCELLED":
        job["reason"], job["ended_at"] = f"cancelled by {cmd.requested_by} before it reached the cluster", utcnow()
    await publish(ctx, job)


async def refused(ctx: UnitOfWork, cmd, reason: str) -> None:
    """A job command no retry can fix: a submit of an unused id is stored REJECTED when the cluster is the tenant's;
    anything else (another tenant's job or cluster) is only logged."""
    if isinstance(cmd, c.SubmitJob) and await PgJobs(ctx.conn).get(cmd.job_id) is None:
        cl = await PgClusters(ctx.conn).get(cmd.cluster_id)
        if cl is not None and cl.tenant_id == cmd.tenant_id:
            return await publish(ctx, new_job(cmd, "REJECTED", reason[:2000]), new=True)
    log.warning("paas.job_command_refused", job_id=str(cmd.job_id), reason=reason)


async def job_logs(query: c.JobLogsQuery, *, pool, runtimes) -> c.JobLogs:
    """A job's output so far, from its cluster's scheduler (empty before it reached it)."""
    async with pool.acquire() as conn:
        job = await PgJobs(conn).get(query.job_id)
        if job is None or job["tenant_id"] != query.tenant_id:
            return c.JobLogs(found=False)
        cl = await PgClusters(conn).get(job["cluster_id"])
    if job["external_id"] is None or cl is None or not cl.handle:
        return c.JobLogs(found=True)
    text = await runtimes[cl.kind].logs(handle_of(cl), job["external_id"], query.limit_bytes)
    return c.JobLogs(found=True, logs=text, truncated=len(text.encode()) >= query.limit_bytes)


def request_of_spec(job: dict[str, Any]) -> JobRequest:
    """The stored job's request (its spec as it arrived)."""
    s = job["spec"]
    return JobRequest(cluster_id=job["cluster_id"], name=job["name"], command=tuple(s.get("command") or ()) or None,
                      entrypoint=s.get("entrypoint"), tasks=s["tasks"], gpus_per_task=s["gpus_per_task"],
                      time_limit_s=s["time_limit_s"], env=dict(s.get("env") or {}), image=s.get("image"),
                      privileged=s.get("privileged", False))
