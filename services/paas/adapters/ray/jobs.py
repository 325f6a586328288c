"""Tessera's jobs as Ray Jobs API submissions, and Ray's answers as Tessera's job states. Pure.

Ray's model is one driver per job: the entrypoint runs once, on a node Ray picks, and fans out itself with
``@ray.remote`` tasks and actors that ask for their own GPUs. So a job of ``tasks > 1`` runs its command once
(with ``TESSERA_TASKS`` and ``TESSERA_GPUS_PER_TASK`` in its environment, to size its fan-out) and the driver
holds no GPU; a job of one task holds its GPUs in the driver itself (``entrypoint_num_gpus``), where
``CUDA_VISIBLE_DEVICES`` names them.

Ray has no time limit: the job's limit travels in its metadata and ``RayRuntime.job`` stops a job past it; a
job stopped after running at least its limit reads TIMEOUT, one stopped sooner CANCELLED.
"""
from __future__ import annotations

import shlex

from ...domain.runtime import JobSpec, JobStatus

SUBMISSION_PREFIX = "tessera-"
STATES = {"PENDING": "PENDING", "RUNNING": "RUNNING", "SUCCEEDED": "SUCCEEDED", "FAILED": "FAILED",
          "STOPPED": "CANCELLED"}


def submission_id(job: JobSpec) -> str:
    """The job's Ray submission id: Ray refuses a second submission of one id, so it is the idempotency key."""
    return f"{SUBMISSION_PREFIX}{job.job_id}"


def driver_gpus(job: JobSpec) -> int:
    """The GPUs the entrypoint itself holds (see the module's note on ``tasks > 1``)."""
    return job.gpus_per_task * job.tasks if job.tasks == 1 else 0


def submission(job: JobSpec) -> dict:
    """The body of ``POST /api/jobs/``."""
    env = dict(job.env)
    if job.tasks > 1:
        env.update(TESSERA_TASKS=str(job.tasks), TESSERA_GPUS_PER_TASK=str(job.gpus_per_task))
    return {"submission_id": submission_id(job), "entrypoint": shlex.join(job.command),
            "runtime_env": {"env_vars": env}, "entrypoint_num_gpus": driver_gpus(job),
            "metadata": {"tessera_job_id": str(job.job_id), "name": job.name, "time_limit_s": str(job.time_limit_s)}}


def already_exists(status: int, text: str) -> bool:
    """Ray's answer to a submission id it has seen: HTTP 500 (not 409) whose text says so."""
    return status >= 400 and "already exists" in text


def time_limit_s(record: dict) -> float | None:
    try:
        return float((record.get("metadata") or {}).get("time_limit_s"))
    except (TypeError, ValueError):
        return None


def _seconds(ms) -> float | None:
    return ms / 1000 if ms else None


def over_time(record: dict, now: float) -> bool:
    """A running job past its time limit (``now``: unix seconds)."""
    limit, started = time_limit_s(record), _seconds(record.get("start_time"))
    return record.get("status") == "RUNNING" and limit is not None and started is not None and now - started > limit


def status_of(record: dict, node_names: dict[str, str] | None = None) -> JobStatus:
    """A ``GET /api/jobs/{id}`` answer as a JobStatus; ``node_names``: Ray node id -> Tessera node name."""
    started, ended = _seconds(record.get("start_time")), _seconds(record.get("end_time"))
    state = STATES.get(record.get("status", ""), "PENDING")
    limit = time_limit_s(record)
    if state == "CANCELLED" and limit is not None and started and ended and ended - started >= limit:
        state = "TIMEOUT"
    where = (node_names or {}).get(record.get("driver_node_id") or "")
    return JobStatus(state=state, exit_code=record.get("driver_exit_code"), started_at=started, ended_at=ended,
                     message=record.get("message") or "", nodes=(where,) if where else ())
