"""The scheduler's gang messages: N allocations (a cluster's nodes) reserved all or nothing
(services/scheduler/domain/gang.py). Each member's own allocate saga then asks ``reserve_slots`` for its
allocation id as usual and is answered from what the gang holds."""
from __future__ import annotations

import uuid
from typing import Literal

from pydantic import Field, field_validator

from shared.wire import Wire

GangFailureCode = Literal["quota-exceeded", "unknown-shape", "no-capacity", "queue-full", "cancelled",
                          "invalid-request"]


class ReserveGang(Wire):
    """Reserve slots for every member, all or nothing; the gang waits whole (holding nothing) when they do not
    all fit now. ``gang_id`` is the idempotency key: a repeat is answered with the same outcome."""
    gang_id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID | None = None
    shape: str
    gpu_count: int = Field(ge=1, le=16, description="GPUs per member (the shape's), as in reserve_slots.")
    pool: str | None = None
    tolerations: list[str] = Field(default_factory=list)
    priority: int = Field(default=0, ge=-1000, le=1000)
    spot: bool = False
    fail_fast: bool = False
    members: list[uuid.UUID] = Field(min_length=1, max_length=64, description="The members' allocation ids.")
    requested_by: str = Field(max_length=200)

    @field_validator("members")
    @classmethod
    def _unique(cls, members: list[uuid.UUID]) -> list[uuid.UUID]:
        if len(set(members)) != len(members):
            raise ValueError("members must be unique")
        return members


class CancelGang(Wire):
    """Withdraw a waiting gang (answered ``gang_rejected`` code ``cancelled``); a placed or unknown gang is left
    as it is."""
    gang_id: uuid.UUID
    tenant_id: uuid.UUID
    requested_by: str = Field(max_length=200)


class GangMember(Wire):
    allocation_id: uuid.UUID
    node_id: uuid.UUID
    slots: list[int]
    gpu_model: str
    pool: str


class GangPlaced(Wire):
    gang_id: uuid.UUID
    tenant_id: uuid.UUID
    members: list[GangMember]
    racks: int = Field(ge=1, description="Distinct racks the members are on.")
    nvlink_domains: int = Field(ge=1, description="Distinct NVLink domains (a node's NVLink group) they use.")
    waited_s: float = 0.0


class GangQueued(Wire):
    gang_id: uuid.UUID
    tenant_id: uuid.UUID
    position: int = Field(ge=1)
    reason: str


class GangRejected(Wire):
    gang_id: uuid.UUID
    tenant_id: uuid.UUID
    reason: str
    code: GangFailureCode
    quota: str | None = None
    limit: int | None = None
    used: int | None = None
    requested: int | None = None
