"""HTTP models of allocations: the request, the read model's view of one, and a page of them."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from services.storage.contracts import MAX_ATTACHED

from ...domain.model import State
from ...domain.scheduling import TOLERATION
from ...http.schema_base import UUID_PATTERN, Body, Int, Labels, Out, ResourceName, ShapeName, Uuid, omittable, text
from ...http.schema_types import MAX_INLINE_KEY_CHARS, Mode, StorageClassName, public_key
from .power_schemas import InstanceOut

Toleration = text(200, pattern=TOLERATION)
InlinePublicKey = public_key(MAX_INLINE_KEY_CHARS)
KeyName = ResourceName
# an image's name (services.scheduler.contracts.NAME) or its id
ImageRef = text(63, min_length=1, pattern=r"^(?:[a-z0-9]([a-z0-9.\-]{0,61}[a-z0-9])?|" + UUID_PATTERN[1:-1] + ")$")


class AllocationVolume(Body):
    """An existing volume of the tenant an allocation mounts at /mnt/<name>."""

    volume_id: Uuid
    mode: Mode = "rw"


# uniqueItems states "each once" only for entries written alike; the handler refuses any two naming one volume
AllocationVolumes = Field(default_factory=list, max_length=MAX_ATTACHED, json_schema_extra={"uniqueItems": True},
                          description=f"At most {MAX_ATTACHED} volumes of the tenant to mount, each at /mnt/<name>: "
                                      "available, or in use and shared (another is a 422 naming it), each once.")


class AllocationCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"id", "tenant_id", "user_id", "state", "price", "gpu_count", "node_id", "saga_id", "created_at",
         "updated_at", "failed_step", "reason", "links", "instance"})
    name: ResourceName
    shape: ShapeName = Field(description="One of the shapes GET /v1/shapes lists; fixes gpu_count. An unknown or "
                                         "deleted shape is a 422 naming the known ones.")
    volume_gb: Int = Field(default=0, ge=0, le=100_000)
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
    network_id: Uuid | None = Field(default=None, description="A tenant network to attach to.")
    image: ImageRef = omittable(description="The image to boot: the name or id of an image GET /v1/images lists "
                                            "(an unknown one is a 422). Left out: the catalog's default image, if "
                                            "there is one; else no image (the driver's own).")
    ssh_keys: list[InlinePublicKey] = omittable(
        max_length=32, description=f"OpenSSH public keys the guest authorises (each at most {MAX_INLINE_KEY_CHARS} "
                                   "characters here: store a longer one with POST /v1/ssh-keys and name it).")
    key_names: list[KeyName] = omittable(max_length=32, description="Names of the caller's stored keys (GET "
                                                                     "/v1/ssh-keys) the guest authorises.")
    volumes: list[AllocationVolume] = AllocationVolumes
    scratch_class: StorageClassName | None = Field(default=None, description="The storage class of the scratch "
                                                                             "volume (volume_gb): one GET "
                                                                             "/v1/storage-classes lists (an unknown "
                                                                             "one is a 422); none: the default.")


class AllocationLinks(Out):
    """Where to read the allocation and stream its events."""

    self: str
    events: str


class AllocationPreemption(Out):
    """The scheduler will preempt the allocation after ``grace_deadline`` (then it is released)."""

    reason: str
    grace_deadline: datetime
    preempted_for: uuid.UUID | None = None


class AllocationInterruption(Out):
    """The allocation's last interruption: its node failed and it was (or is being) rescheduled onto another."""

    category: Literal["node_lost", "gpu_fault", "drain", "maintenance"] | None = Field(
        default=None, description="Why it lost its node: node_lost, gpu_fault, drain or maintenance.")
    reason: str | None = Field(default=None, description="What failed, for the tenant.")
    node_id: uuid.UUID | None = Field(default=None, description="The node it lost.")
    interrupted_at: datetime | None = Field(default=None, description="When it lost the node.")
    next: str | None = Field(default=None, description="What happens next, for the tenant.")
    attempt: int = Field(description="Which reschedule of the allocation this is (1-based).")
    from_node_id: uuid.UUID | None = Field(default=None, description="Once rescheduled: the node it lost.")
    to_node_id: uuid.UUID | None = Field(default=None, description="Once rescheduled: the node it runs on now.")
    gap_s: float | None = Field(default=None, description="Once rescheduled: seconds from interrupted_at until it "
                                                            "was ACTIVE again.")
    rescheduled: bool = Field(default=False, description="It is ACTIVE again on to_node_id.")


class AllocationProblem(Out):
    """Why the scheduler refused the reservation (quota members set for code quota-exceeded)."""

    code: str
    reason: str
    quota: str | None = None
    limit: int | None = None
    used: int | None = None
    requested: int | None = None


class AllocationVolumeOut(Out):
    """A volume the allocation asked to mount."""

    volume_id: uuid.UUID
    mode: Mode


class AllocationPrice(Out):
    """The GPU-hour price quoted when the allocation was requested (from the price list in force then); billing
    rates the allocation's GPU usage with it for its whole life."""

    currency: str = Field(description="ISO 4217 code.")
    hourly_amount: str = Field(description="Exact price of one hour of all its GPUs, in major units, spot discount "
                                           "applied (e.g. '7.2').")
    micros_per_gpu_hour: int = Field(description="The list (on-demand) price per GPU-hour, in micros (millionths "
                                                 "of the major unit).")
    spot_discount_bps: int = Field(description="The price list's spot discount, in basis points.")
    spot: bool = Field(description="Whether the discount applies (a spot allocation).")
    price_list_version: str
    sku_id: str = Field(description="Which price matched (e.g. 'gpu-hour:model=H100').")
    gpu_count: int
    quoted_at: datetime


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
    release_requested_at: datetime | None = Field(
        default=None, description="When its tenant asked for its release (DELETE). A REQUESTED or PROVISIONING "
                                  "allocation keeps its state meanwhile: it is released once ACTIVE, or out of "
                                  "its tenant's line at once.")
    queue_position: int | None = Field(default=None, description="While QUEUED: the place in the tenant's queue (1 = "
                                                                 "next). While REQUESTED with queued_reason "
                                                                 "`tenant_line`: the place in the tenant's line of "
                                                                 "allocations waiting to start (1 = next; past the "
                                                                 "50th place, at most twice the real one).")
    queued_reason: str | None = Field(default=None, description="While QUEUED: why nothing fits now. `tenant_line`: "
                                                                "REQUESTED, waiting for one of the tenant's "
                                                                "allocations in provisioning to end.")
    preemption: AllocationPreemption | None = None
    interruption: AllocationInterruption | None = Field(
        default=None, description="Its last interruption: INTERRUPTED while it is rescheduled after its node "
                                  "failed; kept (with the new node and the gap) once it is ACTIVE again.")
    problem: AllocationProblem | None = None
    image: str | None = Field(default=None, description="The name of the image it boots (as the catalog held it "
                                                        "when requested); null: no image of the catalog.")
    instance: InstanceOut | None = Field(default=None, description="Once ACTIVE: what runs on the node.")
    volumes: list[AllocationVolumeOut] = Field(default_factory=list, description="The volumes it asked to mount "
                                                                                "(each at /mnt/<name>).")
    scratch_class: str | None = Field(default=None, description="The class of its scratch volume (null: the default).")
    price: AllocationPrice | None = Field(
        default=None, description="The GPU-hour price quoted when it was requested, with which billing rates it. "
                                  "null: no price list was in force or none of its prices matched (then each hour "
                                  "is rated with the list in force at that hour, or left unrated), or the shape "
                                  "names no GPU model and the list prices GPU models (the model decides once placed).")


class AllocationPage(Out):
    """One page of the tenant's allocations, newest first."""

    items: list[AllocationOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null on the last page.")
