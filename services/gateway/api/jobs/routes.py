"""Jobs of the caller's tenant: submit, list (of one cluster, or all), read, cancel, and read their output.

A submission is accepted with 202 (SUBMITTING) and travels to the paas service as a command through the outbox;
the read model shows the service's newest document of it (``projection``). What the gateway can tell from its
own views is refused up front, nothing sent: a cluster that is not the tenant's (a 404), one deleting or failed
(a 409), a program the cluster's kind cannot run (a 422), more GPUs than the cluster has (a 422). The tenant's
job policy is the service's to apply: a job it refuses ends REJECTED with the reason. The output is read live
(``paas.job_logs``, core NATS request/reply; the gateway stores none of it). Another tenant's job, or a
malformed id, is a 404.
"""
from __future__ import annotations

import uuid

import asyncpg
from aiohttp import web

from services.paas.contracts import CancelJob, JobLogsQuery, SubmitJob
from shared import rpc

from ...adapters import paas as repo
from ...http.auth import principal_of, require_tenant_member
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, query_value, read_body
from ...http.paging import CURSOR, LIMIT, read_page
from ...http.problems import ProblemError, not_found, validation_problem
from ...http.rpc_problems import answered
from ...http.schema_base import FieldError, integer
from ...http.state import gateway_of
from .schemas import JobCreate, JobLogsOut, JobOut, JobPage

LOGS_TIMEOUT_S = 10.0   # the service asks the cluster's scheduler: a file read or one HTTP call on the node


def job_out(row: asyncpg.Record) -> JobOut:
    j = repo.decoded(row)
    fields = {k: j[k] for k in ("id", "tenant_id", "user_id", "cluster_id", "name", "state", "reason", "exit_code",
                                "external_id", "tasks", "gpus_per_task", "time_limit_s", "nodes", "version",
                                "started_at", "ended_at", "updated_at")}
    base = f"/v1/jobs/{j['id']}"
    return JobOut(**fields, submitted_at=j["created_at"],
                  cancel_requested=j["cancel_requested_at"] is not None and j["state"] not in repo.FINAL_JOB,
                  links={"self": base, "logs": f"{base}/logs", "cluster": f"/v1/clusters/{j['cluster_id']}"})


def _invalid(field: str, message: str, code: str) -> ProblemError:
    return validation_problem([FieldError(field=field, message=message, code=code)])


def _fits_cluster(body: JobCreate, cluster: asyncpg.Record) -> None:
    """422 for what the cluster's kind or size cannot run (the paas service's own rules, told up front)."""
    kind = cluster["kind"]
    if kind == "slurm" and body.entrypoint is not None:
        raise _invalid("entrypoint", "a Slurm cluster runs a command (an argv), not a shell line", "kind")
    if kind == "kubernetes" and body.image is None:
        raise _invalid("image", "a Kubernetes cluster runs a container image", "required")
    if kind != "kubernetes" and body.image is not None:
        raise _invalid("image", f"a {kind} cluster runs on its nodes' own system, not an image", "kind")
    gpus, held = body.tasks * body.gpus_per_task, cluster["node_count"] * cluster["gpu_count"]
    if gpus > held:
        raise _invalid("gpus_per_task", f"tasks × gpus_per_task is {gpus}; the cluster has {held} GPUs in all",
                       "capacity")


async def submit_job(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    body = await read_body(request, JobCreate)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.submit_job") as uow:
        conn = uow.conn
        cluster = await repo.cluster(conn, body.cluster_id, p.tenant_id)
        if cluster is None:
            raise not_found("cluster")
        if cluster["state"] in ("deleting", "failed"):
            raise ProblemError(409, f"the cluster is {cluster['state']}; it takes no jobs", slug="cluster-not-live")
        _fits_cluster(body, cluster)
        row = await repo.insert_job(conn, {"id": uuid.uuid4(), "tenant_id": p.tenant_id, "user_id": p.user_id,
                                           "cluster_id": cluster["id"], "name": body.name, "tasks": body.tasks,
                                           "gpus_per_task": body.gpus_per_task, "time_limit_s": body.time_limit_s})
        await uow.emit("paas.submit_job", SubmitJob(
            job_id=row["id"], tenant_id=p.tenant_id, user_id=p.user_id, requested_by=str(p.user_id),
            **body.model_dump()), correlation_id=str(row["id"]), tenant_id=p.tenant_id)
    return respond(job_out(row), 202, headers={"Location": f"/v1/jobs/{row['id']}"})


async def job_resource(request: web.Request, data: dict, body: JobCreate) -> tuple[dict, dict] | None:
    """The policy resource of a POST /v1/jobs: what the job asks of its cluster (tasks, GPUs, time, image,
    privileged) and the cluster's kind; its tag ``cluster`` is the cluster's name. None when the cluster is not the
    caller's (the handler answers that with its 404)."""
    p = principal_of(request)
    async with gateway_of(request).pool.acquire() as conn:
        cluster = await repo.cluster(conn, body.cluster_id, p.tenant_id) if p.tenant_id else None
    if cluster is None:
        return None
    attrs = {"name": body.name, "cluster_id": str(cluster["id"]), "cluster_kind": cluster["kind"],
             "tasks": body.tasks, "gpus_per_task": body.gpus_per_task, "gpus": body.tasks * body.gpus_per_task,
             "time_limit_s": body.time_limit_s, "privileged": body.privileged}
    if body.image is not None:
        attrs["image"] = body.image
    return attrs, {"cluster": cluster["name"]}


CLUSTER_FILTER = Param("cluster_id", "query", "Only the jobs of this cluster.", uuid.UUID)


async def list_jobs(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    cluster_id = query_value(request, CLUSTER_FILTER)
    items, next_cursor = await read_page(
        request, lambda conn, n, after: repo.job_page(conn, p.tenant_id, cluster_id, n, after))
    return respond(JobPage(items=[job_out(r) for r in items], next_cursor=next_cursor))


async def _job_of(conn: asyncpg.Connection, request: web.Request, tenant_id: uuid.UUID, *,
                  for_update: bool = False) -> asyncpg.Record:
    row = await repo.job(conn, path_uuid(request, "job_id", "job"), tenant_id, for_update=for_update)
    if row is None:
        raise not_found("job")
    return row


async def get_job(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    async with gateway_of(request).pool.acquire() as conn:
        row = await _job_of(conn, request, p.tenant_id)
    return respond(job_out(row))


async def cancel_job(request: web.Request) -> web.Response:
    """202 and one cancel_job; 202 again (nothing sent) once asked; a job that ended is a 409."""
    p = require_tenant_member(request)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.cancel_job") as uow:
        row = await _job_of(uow.conn, request, p.tenant_id, for_update=True)
        if row["state"] in repo.FINAL_JOB:
            raise ProblemError(409, f"the job is {row['state']}; it has ended", slug="job-ended")
        if row["cancel_requested_at"] is None:
            row = await repo.mark_job_cancelling(uow.conn, row["id"])
            await uow.emit("paas.cancel_job", CancelJob(job_id=row["id"], tenant_id=p.tenant_id,
                                                        requested_by=str(p.user_id)),
                           correlation_id=str(row["id"]), tenant_id=p.tenant_id)
    return respond(job_out(row), 202)


LIMIT_BYTES = Param("limit_bytes", "query", "At most this many bytes, the last ones.", integer(1, 1 << 20),
                    default=65536)


async def job_logs(request: web.Request) -> web.Response:
    p = require_tenant_member(request)
    limit_bytes = query_value(request, LIMIT_BYTES)
    gw = gateway_of(request)
    async with gw.pool.acquire() as conn:
        row = await _job_of(conn, request, p.tenant_id)
    with answered("the paas service", "paas", "the job's output cannot be read now", "read the job's output",
                  timeout_s=LOGS_TIMEOUT_S, job_id=str(row["id"])):
        answer = await rpc.request(gw.rt.broker.connection, gw.rt.catalog, "gateway", "paas.job_logs",
                                   JobLogsQuery(job_id=row["id"], tenant_id=p.tenant_id, limit_bytes=limit_bytes),
                                   timeout=LOGS_TIMEOUT_S)
    if not answer.found:
        raise ProblemError(404, "the job has no output yet", slug="job-logs-not-found")
    return respond(JobLogsOut(logs=answer.logs, truncated=answer.truncated))


JOB_ID = Param("job_id", "path", "The job's id.", uuid.UUID, required=True)


ENDPOINTS = [
    Endpoint("POST", "/v1/jobs", submit_job, "submitJob", "Submit a job to a cluster of the tenant", "jobs",
             {202: JobOut}, body=JobCreate, errors=(400, 401, 403, 404, 409, 413, 415, 422),
             headers={202: {"Location": "The job (/v1/jobs/{id})."}}, policy_resource=job_resource,
             description="Accepted as SUBMITTING; the paas service hands it to the cluster's scheduler and follows "
                         "it to its end (SUCCEEDED, FAILED, CANCELLED, TIMEOUT), or refuses it under the tenant's "
                         "job policy (REJECTED, with the reason). Rules the schema cannot state (each a 422 naming "
                         "the field): a Slurm cluster runs a `command`, "
                         "not an `entrypoint`; a Kubernetes cluster needs an `image`, the others refuse one; tasks "
                         "× gpus_per_task is at most the cluster's GPUs. A `cluster_id` that is not a cluster of the "
                         "tenant is a 404; a cluster deleting or failed is a 409. The provider's and the tenant's "
                         "policies judge it first as a `Job` (tasks, gpus_per_task, gpus, time_limit_s, privileged, "
                         "image, cluster_kind): a denial is a 403 `policy-denied` and nothing is sent."),
    Endpoint("GET", "/v1/jobs", list_jobs, "listJobs", "List the tenant's jobs, newest first", "jobs",
             {200: JobPage}, params=(CLUSTER_FILTER, LIMIT, CURSOR), errors=(401, 403, 422)),
    Endpoint("GET", "/v1/jobs/{job_id}", get_job, "getJob", "Read a job", "jobs", {200: JobOut}, params=(JOB_ID,),
             errors=(401, 403, 404)),
    Endpoint("POST", "/v1/jobs/{job_id}/cancel", cancel_job, "cancelJob", "Cancel a job", "jobs", {202: JobOut},
             params=(JOB_ID,), errors=(401, 403, 404, 409),
             description="Accepted with `cancel_requested`; the job ends CANCELLED once its scheduler stopped it. "
                         "Repeating it answers 202 again; a job that ended is a 409."),
    Endpoint("GET", "/v1/jobs/{job_id}/logs", job_logs, "getJobLogs", "Read a job's output so far", "jobs",
             {200: JobLogsOut}, params=(JOB_ID, LIMIT_BYTES), errors=(401, 403, 404, 422, 502, 503, 504),
             description="Read live from the cluster's scheduler through the paas service. 503 (with Retry-After) "
                         "when the service is not connected, 504 when it does not answer in time, 502 when it "
                         "fails to read them; 404 when the job has no output yet."),
]
