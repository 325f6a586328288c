"""A PaaS job as a ``batch/v1`` Job: one container per task from the job's image, its GPUs as the
``nvidia.com/gpu`` limit (the device plugin's resource), never privileged, bounded by ``activeDeadlineSeconds``.
The job's id is a label, so a retry finds the Job it already made."""
from __future__ import annotations

import re

from services.paas.domain.runtime import ClusterError, JobSpec

NAMESPACE = "tessera-jobs"
JOB_ID_LABEL = "tessera.io/job-id"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def job_name(job: JobSpec) -> str:
    """A DNS label of at most 51 characters (a Job's pods add a suffix to it): the name, slugged, and the id."""
    slug = _NOT_DNS.sub("-", job.name.lower()).strip("-")[:38].strip("-") or "job"
    if not slug[0].isalpha():
        slug = "j-" + slug[:36]
    return f"{slug}-{job.job_id.hex[:12]}"


def namespace() -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": {
        "pod-security.kubernetes.io/enforce": "baseline"}}}


def job_manifest(job: JobSpec) -> dict:
    """The Job for ``job``; a job without an image, with no command or with an environment name Kubernetes
    refuses is a permanent error (no retry can fix it)."""
    if not job.image:
        raise ClusterError("a Kubernetes job needs an image", permanent=True)
    if not job.command:
        raise ClusterError("a Kubernetes job needs a command", permanent=True)
    bad = sorted(k for k in job.env if not _ENV_NAME.match(k))
    if bad:
        raise ClusterError(f"environment names Kubernetes refuses: {bad}", permanent=True)
    labels = {JOB_ID_LABEL: str(job.job_id), "app.kubernetes.io/managed-by": "tessera"}
    container = {"name": "task", "image": job.image, "command": list(job.command),
                 "env": [{"name": k, "value": v} for k, v in sorted(job.env.items())],
                 "securityContext": {"privileged": False, "allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}}}
    if job.gpus_per_task:
        container["resources"] = {"limits": {"nvidia.com/gpu": job.gpus_per_task}}
    spec = {"backoffLimit": 0, "activeDeadlineSeconds": job.time_limit_s, "ttlSecondsAfterFinished": 86400,
            "completions": job.tasks, "parallelism": job.tasks,
            "template": {"metadata": {"labels": labels},
                         "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                                  "containers": [container]}}}
    if job.tasks > 1:
        spec["completionMode"] = "Indexed"      # each task knows its index (JOB_COMPLETION_INDEX)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job_name(job), "namespace": NAMESPACE, "labels": labels}, "spec": spec}
