"""Wire contract of the PaaS service: tenant clusters (Slurm, Ray, Kubernetes) over the tenant's own allocations,
and one job API over them.

A tenant admin's cluster is N allocations of one shape, placed as a gang (``scheduler.reserve_gang``: all or
nothing, waiting whole when it does not fit), then each requested through the ordinary allocate saga
(``allocation.request``: quotas, policies, network, volumes as any allocation). Once every node is ACTIVE the
service starts the cluster's scheduler on them (Slurm and Ray real; Kubernetes rendered by a recording driver:
``driver`` says which). Jobs go to the cluster's own scheduler; their state is followed to the end.

Every change of a cluster or a job is answered with the whole object and a ``version`` that only grows
(``paas.cluster_changed``, ``paas.job_changed``), so a read model keeps the highest. A refusal no retry can fix
(over quota, unknown shape, a job the policy refuses, the scheduler's own refusal) is published at once and
visible on the object (``state`` failed / rejected and ``reason``).
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from shared.contract import Message, ServiceContract
from shared.wire import Wire

CLUSTER_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,30}$"
JOB_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
NO_NUL = r"^[^\x00]*$"
MAX_NODES = 64
ClusterName = Annotated[str, StringConstraints(pattern=CLUSTER_NAME_PATTERN)]
JobName = Annotated[str, StringConstraints(pattern=JOB_NAME_PATTERN)]
Arg = Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=NO_NUL)]
EnvValue = Annotated[str, StringConstraints(max_length=4096, pattern=NO_NUL)]
Kind = Literal["slurm", "ray", "kubernetes"]
ClusterState = Literal["placing", "queued", "provisioning", "starting", "ready", "scaling", "deleting", "deleted",
                       "failed"]
NodeState = Literal["placing", "provisioning", "active", "joining", "ready", "draining", "releasing", "released",
                    "failed", "returned", "lost", "rejoining"]
JobState = Literal["SUBMITTING", "PENDING", "RUNNING", "CANCELLING", "SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT",
                   "REJECTED"]


class Autoscaling(Wire):
    """Grow when jobs queue or GPU utilisation stays above the target; shrink when nodes sit idle (drained first)."""

    min_nodes: int = Field(ge=1, le=MAX_NODES)
    max_nodes: int = Field(ge=1, le=MAX_NODES)
    target_gpu_util: float = Field(default=0.7, gt=0, le=1, description="Window-mean GPU utilisation to keep under.",
                                   examples=[0.7])
    cooldown_s: int = Field(default=300, ge=0, le=86400, description="Seconds between two scale changes.")

    @model_validator(mode="after")
    def _ordered(self) -> Autoscaling:
        if self.min_nodes > self.max_nodes:
            raise ValueError("min_nodes must not exceed max_nodes")
        return self


class AdoptedMember(Wire):
    """An allocation the tenant already holds, made a node of a new cluster as it is (the gateway checked it)."""

    allocation_id: uuid.UUID
    node_id: uuid.UUID = Field(description="The node it runs on.")
    attachment_id: uuid.UUID | None = Field(default=None, description="Its attachment to the tenant network.")
    address: str = Field(min_length=1, max_length=64, description="Its IP on the tenant network.")


class CreateCluster(Wire):
    cluster_id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID
    name: ClusterName
    kind: Kind
    shape: str = Field(max_length=63)
    gpu_count: int = Field(ge=1, le=16, description="GPUs per node (the shape's).")
    node_count: int = Field(ge=1, le=MAX_NODES)
    network_id: uuid.UUID | None = None
    pool: str | None = Field(default=None, max_length=63)
    tolerations: list[Annotated[str, StringConstraints(max_length=253)]] = Field(default_factory=list, max_length=16)
    priority: int = Field(default=0, ge=-1000, le=1000)
    spot: bool = False
    autoscaling: Autoscaling | None = None
    requested_by: str = Field(max_length=200)
    members: list[AdoptedMember] = Field(
        default_factory=list, max_length=MAX_NODES,
        description="Allocations the tenant already holds, in node order (the first hosts the controller): the "
                    "cluster is made of them (no gang, no new allocation; node_count is their number) and starts at "
                    "once. They stay the tenant's: a scale-in or a delete drains them and stops the cluster's "
                    "daemons on them, never releases them. Empty: node_count new allocations placed as a gang.")

    @model_validator(mode="after")
    def _members_counted(self) -> CreateCluster:
        if self.members and len(self.members) != self.node_count:
            raise ValueError("node_count must be the number of members")
        if len({m.allocation_id for m in self.members}) != len(self.members):
            raise ValueError("an allocation is named twice in members")
        return self


class ScaleCluster(Wire):
    cluster_id: uuid.UUID
    tenant_id: uuid.UUID
    node_count: int = Field(ge=1, le=MAX_NODES)
    requested_by: str = Field(max_length=200)


class DeleteCluster(Wire):
    cluster_id: uuid.UUID
    tenant_id: uuid.UUID
    requested_by: str = Field(max_length=200)


class SubmitJob(Wire):
    job_id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID
    cluster_id: uuid.UUID
    name: JobName
    command: list[Arg] = Field(default_factory=list, max_length=64, description="argv each task runs.",
                               examples=[["python", "train.py", "--epochs", "3"]])
    entrypoint: Annotated[str, StringConstraints(max_length=16384, pattern=NO_NUL)] | None = Field(
        default=None, description="A shell command line (Ray's entrypoint); exactly one of command and entrypoint.",
        examples=[None])
    tasks: int = Field(default=1, ge=1, le=1024)
    gpus_per_task: int = Field(default=0, ge=0, le=16)
    time_limit_s: int = Field(default=3600, ge=60, le=7 * 86400)
    env: dict[Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN)], EnvValue] = Field(
        default_factory=dict, max_length=64, examples=[{"EPOCHS": "3"}])
    image: str | None = Field(default=None, max_length=512)
    privileged: bool = False
    requested_by: str = Field(max_length=200)

    @model_validator(mode="after")
    def _one_program(self) -> SubmitJob:
        if bool(self.command) == (self.entrypoint is not None):
            raise ValueError("give exactly one of command and entrypoint")
        return self


class CancelJob(Wire):
    job_id: uuid.UUID
    tenant_id: uuid.UUID
    requested_by: str = Field(max_length=200)


class ClusterNodeView(Wire):
    name: str = Field(max_length=80)
    allocation_id: uuid.UUID
    state: NodeState
    address: str | None = Field(default=None, max_length=64, description="Its IP on the tenant network.")
    adopted: bool = Field(default=False, description="An allocation the tenant held before the cluster: a scale-in "
                                                     "or a delete returns it (state returned), never releases it.")


class ClusterChanged(Wire):
    """The whole cluster after a change."""

    cluster_id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    kind: Kind
    shape: str
    gpu_count: int
    node_count: int = Field(description="The nodes it should have (a scale step moves towards it).")
    network_id: uuid.UUID | None = None
    state: ClusterState
    reason: str | None = Field(default=None, max_length=2000)
    driver: str | None = Field(default=None, description="slurm or ray (real), recording (Kubernetes: rendered only).")
    controller: str | None = Field(default=None, description="The controller's address on the tenant network.")
    nodes: list[ClusterNodeView]
    autoscaling: Autoscaling | None = None
    spot: bool = False
    version: int = Field(ge=1)
    created_at: datetime
    updated_at: datetime


class JobChanged(Wire):
    """The whole job after a change."""

    job_id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID
    cluster_id: uuid.UUID
    name: str
    state: JobState
    reason: str | None = Field(default=None, max_length=2000)
    exit_code: int | None = None
    external_id: str | None = Field(default=None, description="The cluster scheduler's own job id.")
    tasks: int
    gpus_per_task: int
    time_limit_s: int
    nodes: list[str] = Field(default_factory=list)
    version: int = Field(ge=1)
    submitted_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None


class JobLogsQuery(Wire):
    job_id: uuid.UUID
    tenant_id: uuid.UUID
    limit_bytes: int = Field(default=65536, ge=1, le=1 << 20)


class JobLogs(Wire):
    found: bool
    logs: str = ""
    truncated: bool = False


SpotNodeState = Literal["requested", "offered", "reclaiming", "released", "failed"]


class SetSpotOffering(Wire):
    """A provider admin's spot offering in a pool. While enabled, the pool's idle GPUs beyond what tenants may claim
    (unused guaranteed quota, pending requests, ``headroom_gpus``) are held by spot allocations of ``tenant_id`` (the
    provider's own tenant: its allocations are billed as spot) and offered to the spot market through the spot
    driver; they are taken back with ``notice_s`` of notice when tenants need them."""

    pool: str = Field(max_length=63)
    enabled: bool
    tenant_id: uuid.UUID
    user_id: uuid.UUID = Field(description="Who set it: the requester of its spot allocations.")
    shape: str = Field(max_length=63, description="The shape of each spot node (one allocation).")
    gpu_count: int = Field(ge=1, le=16, description="GPUs per node (the shape's).")
    gpu_model: str | None = Field(default=None, max_length=63, description="The shape's GPU model, if it names one.")
    max_nodes: int = Field(default=64, ge=1, le=1024)
    headroom_gpus: int = Field(default=0, ge=0, le=100_000, description="GPUs kept free beyond every claim.")
    notice_s: int = Field(default=30, ge=1, le=3600, description="Notice a reclaim gives the spot workload.")
    tolerations: list[Annotated[str, StringConstraints(max_length=253)]] = Field(
        default_factory=list, max_length=16, description="Taints of the pool's nodes its spot allocations tolerate.")
    cluster_name: ClusterName = Field(description="The cluster's name in the spot market (immutable there).")
    group: str = Field(default="tessera", max_length=63, pattern=r"^[A-Za-z0-9._-]+$")
    region: str = Field(default="local", max_length=63, pattern=r"^[A-Za-z0-9._-]+$")
    requested_by: str = Field(max_length=200)


class SpotNodeView(Wire):
    allocation_id: uuid.UUID
    state: SpotNodeState
    node_id: uuid.UUID | None = None
    gpus: int
    requested_at: datetime
    offered_at: datetime | None = None
    reclaim_by: datetime | None = Field(default=None, description="When the notice ends: the node is taken back.")
    reclaim_reason: str | None = Field(default=None, max_length=500)
    ended_at: datetime | None = None


class SpotOfferingChanged(Wire):
    """The whole offering after a change."""

    pool: str
    enabled: bool
    tenant_id: uuid.UUID
    shape: str
    gpu_count: int
    max_nodes: int
    headroom_gpus: int
    notice_s: int
    cluster_name: str
    driver: str = Field(description="recording: the NVCF calls are rendered and recorded, no market is reached.")
    nodes: list[SpotNodeView] = Field(description="Live nodes, then the most recent ended ones.")
    offered_gpus: int = Field(description="GPUs offered now (nodes offered, not being reclaimed).")
    offered_gpu_s: float = Field(description="GPU-seconds offered since it was first enabled.")
    reclaims_total: int
    market_usage: dict[str, dict[str, int]] = Field(default_factory=dict, description=(
        "What the spot market last reported (report_usage): per GPU model, the GPUs offered and those its "
        "workloads use."))
    free_gpus: int | None = Field(default=None, description="The pool's free GPUs at the last decision.")
    reserve_gpus: int | None = Field(default=None, description="What tenants may claim, plus the headroom, then.")
    reason: str | None = Field(default=None, max_length=2000)
    version: int = Field(ge=1)
    updated_at: datetime


def _msg(name: str, model: type[Wire], kind: Literal["command", "event"], summary: str) -> Message:
    return Message(f"paas.{name}", f"paas.{'cmd' if kind == 'command' else 'evt'}.{name}", model, kind, summary)


CONTRACT = ServiceContract(
    service="paas",
    title="Tessera PaaS service",
    description="Owns tenant clusters (Slurm, Ray, Kubernetes) over the tenant's allocations, placed as a gang, and "
                "the jobs submitted to them through one API.",
    messages=[
        _msg("create_cluster", CreateCluster, "command", "Create a tenant cluster of N nodes of a shape (gateway)."),
        _msg("scale_cluster", ScaleCluster, "command", "Grow or shrink a cluster to N nodes (drained first)."),
        _msg("delete_cluster", DeleteCluster, "command", "Delete a cluster and release its allocations."),
        _msg("submit_job", SubmitJob, "command", "Submit a job to a cluster of the tenant."),
        _msg("cancel_job", CancelJob, "command", "Cancel a job."),
        _msg("cluster_changed", ClusterChanged, "event", "A cluster changed: the whole cluster, versioned."),
        _msg("job_changed", JobChanged, "event", "A job changed: the whole job, versioned."),
        _msg("set_spot_offering", SetSpotOffering, "command", "Enable, change or disable a pool's spot offering."),
        _msg("spot_offering_changed", SpotOfferingChanged, "event", "A spot offering changed: whole, versioned."),
        Message("paas.job_logs", "paas.rpc.job_logs", JobLogsQuery, "request",
                "A job's output so far, read from its cluster's scheduler.", reply=JobLogs),
    ],
    receives=["paas.create_cluster", "paas.scale_cluster", "paas.delete_cluster", "paas.submit_job",
              "paas.cancel_job", "scheduler.gang_placed", "scheduler.gang_queued", "scheduler.gang_rejected",
              "allocation.activated", "allocation.failed", "allocation.released", "network.network_attached",
              "allocation.interrupted", "allocation.rescheduled",
              "node_agent.heartbeat", "paas.set_spot_offering", "scheduler.scheduling_stats",
              "scheduler.preemption_notice"],
    sends=["scheduler.reserve_gang", "scheduler.cancel_gang", "allocation.request", "allocation.release"],
)
