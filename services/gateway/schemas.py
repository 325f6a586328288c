"""The HTTP API's pydantic models: request bodies (strict, unknown fields forbidden) and responses.

Each request model names its ``server_owned`` fields: a client sending one gets a 422
that says the field is set by Tessera, rather than a generic "unknown field".
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from .domain.model import Role, State
from .domain.scheduling import TOLERATION

ShapeName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9.\-]{0,61}[a-z0-9])?$")]
NodeStatus = Literal["registering", "registered", "pending_approval", "schedulable", "needs_review"]
Toleration = Annotated[str, StringConstraints(max_length=200, pattern=TOLERATION)]
ResourceName = Annotated[str, StringConstraints(min_length=1, max_length=63,
                                                pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")]
PersonName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._@+-]*$")]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$")]
LabelValue = Annotated[str, StringConstraints(max_length=256)]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=32, description="At most 32 string labels.")]
TenantRole = Literal["tenant_admin", "tenant_user"]


class Body(BaseModel):
    """A request body: strict types, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True)
    server_owned: ClassVar[frozenset[str]] = frozenset()


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- requests ---------------------------------------------------------------------------------------

class TenantCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"id", "created_at", "created_by"})
    name: PersonName


class UserCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"id", "tenant_id", "api_key", "created_at", "created_by"})
    name: PersonName
    role: TenantRole


class NodeCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"id", "status", "requested_at", "requested_by", "registered_at", "slots", "links"})
    name: ResourceName
    gpu_model: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    gpu_count: int = Field(ge=1, le=16)
    labels: Labels = Field(default_factory=dict)
    pool: ShapeName | None = Field(default=None, description="The node pool (default: shared).")
    region: Annotated[str, StringConstraints(min_length=1, max_length=63)] | None = None
    site: Annotated[str, StringConstraints(min_length=1, max_length=63)] | None = None
    rack: Annotated[str, StringConstraints(min_length=1, max_length=63)] | None = None


class AllocationCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"id", "tenant_id", "user_id", "state", "price", "gpu_count", "node_id", "saga_id", "created_at",
         "updated_at", "failed_step", "reason", "links"})
    name: ResourceName
    shape: ShapeName = Field(description="One of the shapes GET /v1/shapes lists; fixes gpu_count. An unknown or "
                                         "deleted shape is a 422 naming the known ones.")
    volume_gb: int = Field(default=0, ge=0, le=100_000)
    labels: Labels = Field(default_factory=dict)
    priority_class: Literal["low", "normal", "high"] = Field(
        default="normal", description="Scheduling priority: low = -100, normal = 0, high = 100. A waiting request of a "
                                      "higher class may preempt spot or lower-priority allocations (never a tenant's "
                                      "guaranteed quota).")
    spot: bool = Field(default=False, description="Preemptible capacity: may be preempted for higher priority requests.")
    pool: ShapeName | None = Field(default=None, description="The node pool to place in (default: the shared pool).")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16,
                                          description="'key=value:NoSchedule' entries: taints this request tolerates.")
    fail_fast: bool = Field(default=False, description="Fail at once instead of waiting in the queue when nothing fits.")
    network_id: uuid.UUID | None = Field(default=None, strict=False, description="A tenant network to attach to.")


# --- responses --------------------------------------------------------------------------------------

class FieldError(Out):
    """One invalid field, query or header parameter."""

    field: str = Field(description="Dotted path of the offending field (or query/header parameter).")
    message: str
    code: str


class Problem(Out):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldError] | None = None


class TokenOut(Out):
    """A short-lived bearer token."""

    access_token: str
    token_type: Literal["Bearer"] = "Bearer"
    expires_in: int = Field(description="Seconds until the token expires.")


class TenantOut(Out):
    """A tenant."""

    id: uuid.UUID
    name: str
    created_at: datetime


class TenantList(Out):
    """Every tenant, oldest first."""

    items: list[TenantOut]


class UserOut(Out):
    """A user of a tenant (or a provider admin, without tenant)."""

    id: uuid.UUID
    tenant_id: uuid.UUID | None
    name: str
    role: Role
    created_at: datetime


class UserCreatedOut(UserOut):
    """The new user, with its API key (shown this once)."""

    api_key: str = Field(description="Shown once; only its hash is stored.")


class UserList(Out):
    """The tenant's users, oldest first (no keys)."""

    items: list[UserOut]


class NodeOut(Out):
    """A node as requested and, once the scheduler confirmed it, registered."""

    id: uuid.UUID
    name: str
    gpu_model: str
    gpu_count: int
    labels: dict[str, str]
    status: NodeStatus
    requested_at: datetime | None = None
    registered_at: datetime | None = None


class NodeList(Out):
    """Every node, by name."""

    items: list[NodeOut]


class AllocationLinks(Out):
    """Where to read the allocation and stream its events."""

    self: str
    events: str


class AllocationPreemption(Out):
    """The scheduler will preempt the allocation after ``grace_deadline`` (then it is released)."""

    reason: str
    grace_deadline: datetime
    preempted_for: uuid.UUID | None = None


class AllocationProblem(Out):
    """Why the scheduler refused the reservation (quota members set for code quota-exceeded)."""

    code: str
    reason: str
    quota: str | None = None
    limit: int | None = None
    used: int | None = None
    requested: int | None = None


class AllocationOut(Out):
    """An allocation as the gateway's read model shows it."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    shape: str
    gpu_count: int
    volume_gb: int
    labels: dict[str, str]
    state: State
    node_id: uuid.UUID | None = None
    failed_step: str | None = None
    reason: str | None = None
    created_at: datetime
    updated_at: datetime
    links: AllocationLinks
    priority: int = 0
    priority_class: Literal["low", "normal", "high"] | None = Field(default="normal", description="null: a custom priority.")
    spot: bool = False
    pool: str | None = None
    tolerations: list[str] = Field(default_factory=list)
    fail_fast: bool = False
    network_id: uuid.UUID | None = None
    queue_position: int | None = Field(default=None, description="While QUEUED: the place in the tenant's queue (1 = next).")
    queued_reason: str | None = Field(default=None, description="While QUEUED: why nothing fits now.")
    preemption: AllocationPreemption | None = None
    problem: AllocationProblem | None = None


class AllocationPage(Out):
    """One page of the tenant's allocations, newest first."""

    items: list[AllocationOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page.")


class DeadLetter(Out):
    """A dead-lettered message."""

    seq: int
    subject: str
    time: datetime | None
    headers: dict[str, str] = Field(description="The Tessera-DLQ-* headers: reason, error, consumer, origin stream and sequence.")
    body: Any = Field(description="The dead-lettered message: its envelope when it is JSON, else its text.")


class DeadLetterList(Out):
    """The newest dead letters, newest first."""

    items: list[DeadLetter]
