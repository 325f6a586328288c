"""Events the Allocation aggregate records; the handlers write them to the outbox with the state change.

Field names match the wire events in ``services.allocation.contracts`` so the
mapping is a plain ``asdict``; the saga-reply fields (saga id, step, key) are
added by the participant kit, not recorded here.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class AllocationEvent:
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    state: str
    at: datetime


@dataclass(frozen=True, kw_only=True)
class Request:
    """The request's spec and its scheduling and network options (contracts.Scheduling), as Requested and
    Interrupted carry them (a reschedule places the allocation again from them)."""
    user_id: uuid.UUID
    shape: str
    gpu_count: int
    volume_gb: int
    labels: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    spot: bool = False
    pool: str | None = None
    tolerations: list[str] = field(default_factory=list)
    fail_fast: bool = False
    network_id: uuid.UUID | None = None
    guest: dict | None = None
    volumes: list[dict] = field(default_factory=list)     # existing volumes to mount: {volume_id, mode}
    scratch_class: str | None = None
    price: dict | None = None                             # the quoted GPU-hour price (billing.PriceSnapshot)


SCHEDULING_OPTIONS = frozenset({"priority", "spot", "pool", "tolerations", "fail_fast", "network_id", "guest", "volumes",
                                "scratch_class", "price"})


@dataclass(frozen=True)
class Requested(AllocationEvent, Request):
    name: str


@dataclass(frozen=True)
class Activated(AllocationEvent):
    node_id: uuid.UUID
    instance: dict | None = None


@dataclass(frozen=True)
class Interrupted(AllocationEvent, Request):
    """The allocation's node failed under it: what the tenant is told, and all a reschedule needs to place it
    again (the request, as Requested carries it)."""
    node_id: uuid.UUID
    category: str
    reason: str
    interrupted_at: datetime
    next: str
    attempt: int                                          # the reschedule this starts, 1-based


@dataclass(frozen=True)
class Rescheduled(AllocationEvent):
    """The interrupted allocation is ACTIVE again, on ``to_node_id``; ``gap_s``: seconds the tenant went without."""
    from_node_id: uuid.UUID
    to_node_id: uuid.UUID
    interrupted_at: datetime
    gap_s: float
    attempt: int
    instance: dict | None = None


@dataclass(frozen=True)
class ReleaseRequested(AllocationEvent):
    requested_by: uuid.UUID | None
    node_id: uuid.UUID | None
    volume_gb: int
    labels: dict[str, str] = field(default_factory=dict)
    reason: str | None = None


@dataclass(frozen=True)
class Released(AllocationEvent):
    pass


@dataclass(frozen=True)
class Failed(AllocationEvent):
    failed_step: str
    reason: str
