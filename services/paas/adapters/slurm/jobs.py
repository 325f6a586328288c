"""What Tessera's jobs and nodes are in slurmrestd's v0.0.38 shapes, both ways: pure functions, no I/O."""
from __future__ import annotations

import math
import re
import shlex

from ...domain.runtime import JobSpec, JobStatus, NodeUse
from .config import PARTITION, ClusterFiles

COMMENT_PREFIX = "tessera:"

STATES = {"PENDING": "PENDING", "CONFIGURING": "PENDING", "REQUEUED": "PENDING", "RESV_DEL_HOLD": "PENDING",
          "REQUEUE_HOLD": "PENDING", "REQUEUE_FED": "PENDING", "RUNNING": "RUNNING", "COMPLETING": "RUNNING",
          "SUSPENDED": "RUNNING", "STOPPED": "RUNNING", "SIGNALING": "RUNNING", "STAGE_OUT": "RUNNING",
          "RESIZING": "RUNNING", "COMPLETED": "SUCCEEDED", "FAILED": "FAILED", "NODE_FAIL": "FAILED",
          "OUT_OF_MEMORY": "FAILED", "BOOT_FAIL": "FAILED", "DEADLINE": "FAILED", "PREEMPTED": "FAILED",
          "CANCELLED": "CANCELLED", "REVOKED": "CANCELLED", "TIMEOUT": "TIMEOUT"}

# Slurm's error codes that say the request itself is wrong (slurmrestd answers them with HTTP 500): retrying
# cannot help. ESLURM_INVALID_PARTITION_NAME (2000), ACCESS_DENIED (2002), REQUESTED_NODES_NOT_IN_PARTITION
# (2004), TOO_MANY_REQUESTED_CPUS (2005), INVALID_NODE_COUNT (2006), JOB_MISSING_SIZE_SPECIFICATION (2008),
# JOB_SCRIPT_MISSING (2009), PATHNAME_TOO_LONG (2012), REQUESTED_NODE_CONFIG_UNAVAILABLE (2014: more GPUs
# than any node set has), REQUESTED_PART_CONFIG_UNAVAILABLE (2015), INVALID_TIME_LIMIT (2051), INVALID_GRES (2072).
PERMANENT_CODES = frozenset({2000, 2002, 2004, 2005, 2006, 2008, 2009, 2012, 2014, 2015, 2051, 2072})


def comment(job: JobSpec) -> str:
    return f"{COMMENT_PREFIX}{job.job_id}"


def layout(job: JobSpec, node_gpus: list[int]) -> dict:
    """How the tasks spread: a GPU job packs as many tasks on a node as the smallest GPU node holds, so a 2-task,
    1-GPU-per-task job on two 1-GPU nodes runs one task on each; a CPU-only job lets Slurm choose its nodes."""
    tasks = max(1, job.tasks)
    if job.gpus_per_task <= 0:
        return {"tasks": tasks, "nodes": [1, max(1, min(tasks, len(node_gpus) or 1))]}
    gpu_nodes = [g for g in node_gpus if g > 0]
    per_node = max(1, min(gpu_nodes, default=job.gpus_per_task) // job.gpus_per_task)
    per_node = min(per_node, tasks)
    count = math.ceil(tasks / per_node)
    return {"tasks": tasks, "tasks_per_node": per_node, "nodes": [count, count],
            "gpus_per_task": str(job.gpus_per_task)}


def script(job: JobSpec) -> str:
    """The batch script: one ``srun`` of the command over every task of the allocation."""
    return "#!/bin/bash\nexec srun --kill-on-bad-exit=1 -- " + shlex.join(job.command) + "\n"


def submit_body(job: JobSpec, node_gpus: list[int], files: ClusterFiles) -> dict:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", **job.env, "SLURM_CONF": str(files.slurm_conf)}
    return {"script": script(job), "job": {
        "name": job.name, "partition": PARTITION, "comment": comment(job),
        "time_limit": max(1, math.ceil(job.time_limit_s / 60)),
        "current_working_directory": str(files.jobs), "standard_output": str(files.jobs / "%j.out"),
        "environment": env, **layout(job, node_gpus)}}


def refused(raw: dict) -> bool:
    """A record Slurm keeps of a submission it refused (FAILED, BadConstraints, never ran): not the job, so a
    retry submits again and is refused again, with the same words."""
    return raw.get("job_state") == "FAILED" and raw.get("state_reason") == "BadConstraints" and not raw.get("nodes")


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """Slurm's compressed host list (``a-[0-2,5],b``) as names; zero padding is kept (``n[01-02]``)."""
    names: list[str] = []
    for prefix, ranges, suffix in re.findall(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)", expr or ""):
        if not ranges:
            names.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{prefix}{str(i).zfill(len(lo))}{suffix}")
    return tuple(names)


def _time(value) -> float | None:
    return float(value) if value else None


def decode_wait_status(code: int) -> int:
    """A wait status as a shell reports it: the exit status, or 128 + the signal that ended the process."""
    return code >> 8 if code & 0x7F == 0 else 128 + (code & 0x7F)


def job_status(raw: dict) -> JobStatus:
    """A v0.0.38 job as Tessera's status; the exit code is the process's (Slurm keeps a wait status)."""
    state = STATES.get(raw.get("job_state", ""), "FAILED")
    code = raw.get("exit_code")
    exit_code = None if code is None or state in ("PENDING", "RUNNING") else decode_wait_status(code)
    reason = raw.get("state_reason") or ""
    started = _time(raw.get("start_time")) if state != "PENDING" else None   # a pending job's is an estimate
    return JobStatus(state=state, exit_code=exit_code, started_at=started,
                     ended_at=_time(raw.get("end_time")) if state not in ("PENDING", "RUNNING") else None,
                     message="" if reason == "None" else reason, nodes=expand_hostlist(raw.get("nodes", "")))


def gpu_count(gres: str) -> int:
    """GPUs in a node's ``gres`` or ``gres_used``: ``gpu:1(IDX:0)``, ``gpu:a100:2(IDX:0-1)``, ``gpu:0``."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres or ""):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def node_use(raw: dict, running: int) -> NodeUse:
    """Slurm's DRAIN flag read as draining while work runs and drained once none does (DRAINING/DRAINED)."""
    state = raw.get("state", "unknown").lower()
    flags = {f.upper() for f in raw.get("state_flags", [])}
    if "DRAIN" in flags:
        state = "draining" if running or state in ("allocated", "mixed", "completing") else "drained"
    return NodeUse(name=raw["name"], state=state, running_jobs=running, gpus_in_use=gpu_count(raw.get("gres_used", "")))


def running_per_node(jobs: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for raw in jobs:
        if raw.get("job_state") in ("RUNNING", "COMPLETING", "SUSPENDED"):
            for name in expand_hostlist(raw.get("nodes", "")):
                counts[name] = counts.get(name, 0) + 1
    return counts
