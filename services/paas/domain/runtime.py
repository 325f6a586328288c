"""What the PaaS asks of a tenant cluster's scheduler, whatever its kind (the drivers implement it).

A cluster is a set of the tenant's allocations (its nodes), all on the tenant's network. ``nodes[0]`` hosts the
controller (Slurm's ``slurmctld``, Ray's head, Kubernetes' first control-plane node): the controller listens only
on that node's tenant-network address, so only the tenant's own nodes reach it. Tessera itself talks to the
controller's API through ``ClusterHandle.api`` (a Unix socket or a URL the driver chose), never over the tenant
network.

Every call is idempotent: a driver may be asked again after a crash (start a started cluster, submit a job already
submitted — the job's id is its idempotency key, looked up before a retry submits again).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal, Protocol

ClusterKind = Literal["slurm", "ray", "kubernetes"]
JobState = Literal["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"]
TERMINAL: frozenset[str] = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"})


class ClusterError(Exception):
    """The cluster's scheduler refused or failed; ``permanent``: no retry can fix it (a bad request)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class ClusterNode:
    """One of the cluster's nodes: one allocation of the tenant."""

    name: str                       # the scheduler's name for it: "<cluster name>-<n>", stable across scale steps
    allocation_id: uuid.UUID
    address: str                    # its IP on the tenant network
    netns: str | None = None        # the slot's network namespace (namespace slots); None on a guest or bare metal
    gpus: int = 0
    gpu_devices: tuple[str, ...] = ()   # device files of its GPUs (/dev/nvidia<i>; character-device stand-ins without)
    cpus: int = 1
    memory_mb: int = 1024


@dataclass(frozen=True)
class ClusterSpec:
    cluster_id: uuid.UUID
    tenant_id: uuid.UUID
    name: str                       # DNS-label: ^[a-z][a-z0-9-]{0,30}$
    kind: ClusterKind
    nodes: tuple[ClusterNode, ...]  # nodes[0] hosts the controller

    @property
    def controller(self) -> ClusterNode:
        return self.nodes[0]


@dataclass(frozen=True)
class ClusterHandle:
    """What a started cluster is known by; kept by the service and handed back on every later call."""

    cluster_id: uuid.UUID
    controller: str                 # the controller's address on the tenant network, host:port
    api: str                        # how Tessera reaches its API: "unix:<path>" or "http://host:port"
    driver: str                     # "slurm", "ray", or "recording" where the calls are only rendered
    details: dict = field(default_factory=dict)   # driver-specific, JSON-serialisable (pids, state dir, versions)


@dataclass(frozen=True)
class JobSpec:
    job_id: uuid.UUID               # the idempotency key (Slurm: in the job's comment; Ray: the submission id)
    name: str
    command: tuple[str, ...]        # argv run by each task (Slurm) or the entrypoint, shell-quoted (Ray)
    tasks: int = 1
    gpus_per_task: int = 0
    time_limit_s: int = 3600
    env: dict[str, str] = field(default_factory=dict)
    image: str | None = None        # a container image (Kubernetes); Slurm and Ray run on the node's own userland


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    exit_code: int | None = None
    started_at: float | None = None     # unix seconds
    ended_at: float | None = None
    message: str = ""                   # the scheduler's reason (pending reason, failure)
    nodes: tuple[str, ...] = ()         # where it ran


@dataclass(frozen=True)
class NodeUse:
    """A node as its scheduler sees it, for autoscaling and draining."""

    name: str
    state: str                      # the scheduler's own word: idle, mixed, allocated, draining, drained, down…
    running_jobs: int
    gpus_in_use: int


class ClusterRuntime(Protocol):
    """One per kind. Blocking work (processes, HTTP) is awaited; every call is idempotent."""

    kind: ClusterKind

    async def start(self, spec: ClusterSpec) -> ClusterHandle:
        """Configure and start the controller and every node's daemon; return once the controller answers."""

    async def set_nodes(self, spec: ClusterSpec, handle: ClusterHandle) -> ClusterHandle:
        """Make the cluster's nodes exactly ``spec.nodes`` (start new nodes' daemons, stop removed ones): scale out
        and in. Removing a node that still runs work is the caller's mistake: drain it first."""

    async def drain(self, handle: ClusterHandle, node: str, reason: str) -> None:
        """Stop new work landing on ``node``; running work finishes (Slurm DRAIN)."""

    async def nodes(self, handle: ClusterHandle) -> list[NodeUse]:
        """Every node's state: ``drained`` (Slurm: DRAIN with nothing running) is the word a scale-in waits for."""

    async def stop(self, handle: ClusterHandle) -> None:
        """Stop every daemon and remove the cluster's state; a stopped or unknown cluster is fine."""

    async def submit(self, handle: ClusterHandle, job: JobSpec) -> str:
        """Submit; return the scheduler's job id. A job already submitted (same ``job_id``) returns its id."""

    async def job(self, handle: ClusterHandle, external_id: str) -> JobStatus:
        """The job's state now."""

    async def logs(self, handle: ClusterHandle, external_id: str, limit_bytes: int = 65536) -> str:
        """The job's output so far (its last ``limit_bytes``)."""

    async def cancel(self, handle: ClusterHandle, external_id: str) -> None:
        """Cancel; a finished job is fine."""

    async def pending(self, handle: ClusterHandle) -> int:
        """Jobs waiting for resources (autoscaling's queue signal)."""

    # optional: async def requeue(self, handle, external_ids: list[str]) -> list[str] — run again the jobs a lost
    # node's failure ended (a job still running, pending or ended otherwise is left alone); the ids it requeued

    async def replace_node(self, spec: ClusterSpec, handle: ClusterHandle, node: ClusterNode) -> ClusterHandle:
        """``node`` (same name) was lost with its host and is back in a new slot, maybe at a new address: bring its
        daemon up there and return it to service; the work that ran on it is requeued where the scheduler can
        (Slurm), else failed. ``spec`` is the cluster with ``node`` in its new place. Optional: a driver without it
        gets ``set_nodes`` instead. A controller node that cannot be moved is a permanent error."""
