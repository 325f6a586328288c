"""Tessera's jobs as Ray Jobs API submissions, and Ray's answers as Tessera's job states. Pure.

Ray's model is one driver per job: the entrypoint runs once, on a node Ray picks, and fans out itself with
``@ray.remote`` tasks and actors that ask for their own GPUs. So a job of ``tasks > 1`` runs its command once
(with ``TESSERA_TASKS`` and ``TESSERA_GPUS_PER_TASK`` in its environment, to size its fan-out) and the driver
holds no GPU; a job of one task holds its GPUs in the driver itself (``entrypoint_num_gpus``), where
``CUDA_VISIBLE_DEVICES`` names them.

Ray has no time limit, and its ``start_time`` is the submission's, not the run's (a job queued for an hour
would be past its limit the moment it starts). So the node enforces the limit: the entrypoint runs under
coreutils ``timeout`` (SIGTERM at the limit, SIGKILL 10 s later, its whole process group), which counts from the
run's start and needs no poll. Its exit (124, or 137 after the SIGKILL) after at least the limit reads TIMEOUT.
"""
from __future__ import annotations

import shlex

from ...domain.runtime import JobSpec, JobStatus

SUBMISSION_PREFIX = "tessera-"
KILL_AFTER_S = 10
TIMED_OUT = frozenset({124, 128 + 9})     # coreutils timeout: the limit passed; killed after the grace
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
    entrypoint = shlex.join(["timeout", f"--kill-after={KILL_AFTER_S}", str(job.time_limit_s), *job.command])
    return {"submission_id": submission_id(job), "entrypoint": entrypoint,
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


def status_of(record: dict, node_names: dict[str, str] | None = None) -> JobStatus:
    """A ``GET /api/jobs/{id}`` answer as a JobStatus; ``node_names``: Ray node id -> Tessera node name."""
    state = STATES.get(record.get("status", ""), "PENDING")
    submitted, ended = _seconds(record.get("start_time")), _seconds(record.get("end_time"))
    code, limit, message = record.get("driver_exit_code"), time_limit_s(record), record.get("message") or ""
    if state == "FAILED" and code in TIMED_OUT and limit is not None and submitted and ended \
            and ended - submitted >= limit:
        state, message = "TIMEOUT", f"stopped at its time limit of {limit:g}s"
    where = (node_names or {}).get(record.get("driver_node_id") or "")
    return JobStatus(state=state, exit_code=code, started_at=None if state == "PENDING" else submitted,
                     ended_at=ended, message=message, nodes=(where,) if where else ())
