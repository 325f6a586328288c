"""HTTP models of the inventory API: node detail and approval, pools, shapes, quotas, and their problems."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints

from services.scheduler.contracts import NAME

from .domain.scheduling import TAINT_VALUE
from .schemas import Body, LabelKey, Labels, NodeStatus, Out, Problem

InventoryName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=NAME)]
GpuModel = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
TaintValue = Annotated[str, StringConstraints(max_length=80, pattern=TAINT_VALUE)]
Taints = Annotated[dict[LabelKey, TaintValue], Field(max_length=16, description="key -> 'value:NoSchedule'.")]


# --- requests ---------------------------------------------------------------------------------------

class SlotMapApproval(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"approved_by", "node_id"})
    proposal: int = Field(ge=1, description="The proposal number shown by GET /v1/nodes/{node_id}; a stale one is a 409.")
    wipe_policy: str | None = Field(default=None, max_length=64,
                                    description="Overrides every slot's wipe policy; an empty string makes none schedulable.")


class NodePatch(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"id", "name", "status", "gpu_model", "gpu_count", "proposal", "version", "requested_by"})
    pool: InventoryName | None = None
    labels: Labels | None = None
    taints: Taints | None = None
    cordoned: bool | None = None
    reason: str | None = Field(default=None, max_length=500)


class PoolDefinition(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"name", "version"})
    policy: Literal["pack", "spread"] = Field(default="pack", description="pack (default) keeps whole nodes free; spread.")
    taints: Taints = Field(default_factory=dict)
    description: str = Field(default="", max_length=500)


class ShapeDefinition(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"name", "version", "deleted"})
    kind: Literal["bare_metal", "vm", "mig"]
    gpu_count: int = Field(ge=1, le=16)
    gpu_model: GpuModel | None = None
    mig_profile: str | None = Field(default=None, min_length=1, max_length=32)


class TenantQuotaSet(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"used", "tenant_id", "pool", "gpu_model", "version"})
    limit: int = Field(ge=0, le=1_000_000, description="GPUs of this model the tenant may hold in this pool.")
    guaranteed: int = Field(default=0, ge=0, le=1_000_000,
                            description="GPUs never preempted for others (at most the limit).")


class UserQuotaSet(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"used", "tenant_id", "user_id", "pool", "gpu_model", "version"})
    limit: int = Field(ge=0, le=1_000_000, description="The user's share of the tenant's quota (at most the tenant's limit).")


# --- responses --------------------------------------------------------------------------------------

class Rejection(Out):
    """Why the scheduler refused the last inventory command about this resource."""

    command: str
    reason: str
    event_id: str | None = None
    at: datetime | None = None


class NodeDetail(Out):
    """A node's whole document as the scheduler last published it (and the gateway's registration times)."""

    id: uuid.UUID
    name: str
    gpu_model: str
    gpu_count: int
    labels: dict[str, str]
    status: NodeStatus
    pool: str
    region: str | None = None
    site: str | None = None
    rack: str | None = None
    taints: dict[str, str]
    cordoned: bool
    proposal: int | None = Field(default=None, description="The slot-map proposal awaiting approval.")
    proposed_slot_map: dict[str, Any] | None = None
    approved_slot_map: dict[str, Any] | None = None
    review: list[str] = Field(description="Why the node needs review (discovery differs from the approved map).")
    free_slots: int
    version: int = Field(description="The scheduler document's version; 0 before the first one.")
    last_rejection: Rejection | None = None
    requested_at: datetime | None = None
    registered_at: datetime | None = None
    changed_at: datetime | None = None


class PoolOut(Out):
    """A node pool."""

    name: str
    policy: Literal["pack", "spread"]
    taints: dict[str, str]
    description: str
    version: int | None = Field(default=None, description="null until the scheduler published the pool.")
    last_rejection: Rejection | None = None


class PoolList(Out):
    """Every pool, by name."""

    items: list[PoolOut]


class ShapeOut(Out):
    """A capacity shape a tenant may ask for."""

    name: str
    kind: Literal["bare_metal", "vm", "mig"]
    gpu_count: int
    gpu_model: str | None = None
    mig_profile: str | None = None
    deleted: bool = False
    version: int | None = Field(default=None, description="null: a built-in default (the catalog is still empty).")
    last_rejection: Rejection | None = None


class ShapeList(Out):
    """The shapes a tenant may ask for, by name."""

    items: list[ShapeOut]


class UserQuotaOut(Out):
    """A tenant admin's split of the tenant's quota for one user."""

    user_id: uuid.UUID
    limit: int
    used: int
    version: int | None = None


class QuotaOut(Out):
    """A tenant's quota for one GPU model in one pool, with its users' splits."""

    tenant_id: uuid.UUID
    pool: str
    gpu_model: str
    limit: int | None = Field(description="null: no tenant quota is set, so the tenant may not allocate there "
                                          "(only users' splits exist).")
    guaranteed: int = 0
    used: int = 0
    version: int | None = None
    users: list[UserQuotaOut] = Field(default_factory=list)


class QuotaList(Out):
    """The tenant's quotas, by pool and GPU model."""

    items: list[QuotaOut]


class UserQuotaSetOut(UserQuotaOut):
    """The requested split (the scheduler applies it; GET shows it once applied)."""

    tenant_id: uuid.UUID
    pool: str
    gpu_model: str


class QuotaProblem(Problem):
    """403 quota-exceeded: the quota that refuses the request, its limit, current use and the GPUs asked for."""

    quota: str
    limit: int
    used: int
    requested: int


class ProposalProblem(Problem):
    """409: the node is not awaiting approval of this proposal."""

    current_proposal: int | None
    node_status: str
