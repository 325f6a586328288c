"""HTTP models of jobs: the submission, the job as shown, and its output.

A submission is checked with the paas service's own rules (services.paas.contracts: the job name's and the env
names' patterns, the lengths of argv elements, env values and the entrypoint, the bounds of tasks, GPUs and
time), so a body the gateway accepts is one the service accepts; and, as every string the API reads, no control
character but tab, line feed and carriage return (the contract refuses only NUL: the other controls have no
place in a command line or a variable either). Env names the schedulers and the platform set themselves are
refused here as the service refuses them.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar

from pydantic import ConfigDict, Field, field_validator, model_validator

from services.paas.contracts import ENV_NAME_PATTERN, JOB_NAME_PATTERN, JobState

from ...http.schema_base import Body, Out, Uuid, integer, text

# the scheduler's and the platform's own variables: the paas service refuses a job setting one (its job rules)
RESERVED_ENV_PREFIXES = ("SLURM_", "RAY_", "CUDA_", "TESSERA_")
JobName = text(63, min_length=1, pattern=JOB_NAME_PATTERN)
Arg = text(4096, min_length=1, multiline=True)
EnvName = text(128, min_length=1, pattern=ENV_NAME_PATTERN)
EnvValue = text(4096, multiline=True)
Entrypoint = text(16384, min_length=1, multiline=True)
Image = text(512, min_length=1)
_OWNED = frozenset({"id", "tenant_id", "user_id", "state", "reason", "exit_code", "external_id", "nodes", "version",
                    "submitted_at", "started_at", "ended_at", "updated_at", "links"})


# exactly one program: a non-empty command, or an entrypoint (the document states it as this oneOf)
_ONE_PROGRAM = {"oneOf": [{"required": ["command"], "properties": {"command": {"minItems": 1}}},
                          {"required": ["entrypoint"], "properties": {"entrypoint": {"not": {"type": "null"}}}}]}


class JobCreate(Body):
    model_config = ConfigDict(json_schema_extra=_ONE_PROGRAM)
    server_owned: ClassVar[frozenset[str]] = _OWNED
    cluster_id: Uuid = Field(description="A cluster of the tenant (GET /v1/clusters); another's is a 404.")
    name: JobName = Field(description="Lower-case letters, digits and '-', at most 63.")
    command: list[Arg] = Field(default_factory=list, max_length=64,
                               description="The argv each task runs (no NUL in an element). Exactly one of command "
                                           "and entrypoint; a Slurm cluster runs a command.")
    entrypoint: Entrypoint | None = Field(default=None, description="A shell command line (Ray's entrypoint).")
    tasks: integer(1, 1024) = Field(default=1, description="How many tasks (processes) it runs.")
    gpus_per_task: integer(0, 16) = Field(default=0, description="GPUs each task holds; tasks × gpus_per_task is at "
                                                                 "most the cluster's GPUs (a 422).")
    time_limit_s: integer(60, 7 * 86400) = Field(default=3600, description="Killed (TIMEOUT) after this long.")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=64, description=(
        "Environment variables; names starting " + ", ".join(RESERVED_ENV_PREFIXES) + " are the scheduler's and "
        "the platform's own (a 422)."))
    image: Image | None = Field(default=None, description="The container image: required on a "
                                                                       "Kubernetes cluster, refused on the others.")
    privileged: bool = Field(default=False, description="Run privileged, if the tenant's job policy allows it.")

    @field_validator("env")
    @classmethod
    def _not_reserved(cls, env: dict[str, str]) -> dict[str, str]:
        reserved = sorted(n for n in env if n.upper().startswith(RESERVED_ENV_PREFIXES))
        if reserved:
            raise ValueError(f"{', '.join(reserved)}: names starting {', '.join(RESERVED_ENV_PREFIXES)} are the "
                             "scheduler's and the platform's own")
        return env

    @model_validator(mode="after")
    def _one_program(self) -> JobCreate:
        if bool(self.command) == (self.entrypoint is not None):
            raise ValueError("give exactly one of command and entrypoint")
        return self


class JobLinks(Out):
    self: str
    logs: str
    cluster: str


class JobOut(Out):
    """A job: SUBMITTING, PENDING, RUNNING, CANCELLING, then SUCCEEDED, FAILED, CANCELLED, TIMEOUT or REJECTED."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID | None = Field(description="Who submitted it.")
    cluster_id: uuid.UUID
    name: str
    state: JobState
    reason: str | None = Field(description="Why it failed or was rejected.")
    exit_code: int | None
    external_id: str | None = Field(description="The cluster scheduler's own job id.")
    tasks: int
    gpus_per_task: int
    time_limit_s: int
    nodes: list[str] = Field(description="The cluster nodes it runs on.")
    cancel_requested: bool = Field(description="A cancel was asked for and the service has not yet answered it.")
    version: int = Field(description="The paas service's version of it (0: not yet answered).")
    submitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    updated_at: datetime
    links: JobLinks


class JobPage(Out):
    """One page of the tenant's jobs, newest first."""

    items: list[JobOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page.")


class JobLogsOut(Out):
    """The job's output so far, read live from its cluster's scheduler."""

    logs: str
    truncated: bool = Field(description="Only the last limit_bytes are shown.")
