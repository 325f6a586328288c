"""A tenant cluster and its nodes (pure): how it moves from placed to ready, scales and goes away.

A cluster's nodes are allocations of its tenant, one per member. Members are added a gang at a time (the
creation, then each scale-out step): the scheduler places a gang whole or not at all, then each member runs the
ordinary allocate saga. The member's allocation id is derived from the cluster and its index, so a redelivered
command never makes a second allocation.

States: placing → (queued →) provisioning → starting → ready; ready → scaling → ready; any → deleting → deleted;
failed when the first gang is refused or a first node fails (the rest is released). A failure during a scale
step leaves the cluster ready with the reason, and the failed member released.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

LIVE_MEMBER = frozenset({"placing", "provisioning", "active", "joining", "ready", "draining"})
_NS = uuid.UUID("3c1f7a4e-5b7d-4f0e-9d7a-2f9a1c6b8e01")


def member_id(cluster_id: uuid.UUID, index: int) -> uuid.UUID:
    """The allocation id of the cluster's ``index``-th node (stable: a retried step names the same allocation)."""
    return uuid.uuid5(_NS, f"{cluster_id}:{index}")


def gang_id(cluster_id: uuid.UUID, first_index: int) -> uuid.UUID:
    """The gang of the members added from ``first_index`` on (the creation's gang starts at 0)."""
    return uuid.uuid5(_NS, f"{cluster_id}:gang:{first_index}")


@dataclass
class Member:
    allocation_id: uuid.UUID
    idx: int
    gang_id: uuid.UUID
    state: str
    node_id: uuid.UUID | None = None
    attachment_id: uuid.UUID | None = None
    address: str | None = None
    reason: str | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_MEMBER


@dataclass
class Cluster:
    id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID
    name: str
    kind: str
    shape: str
    gpu_count: int
    node_count: int
    network_id: uuid.UUID | None
    pool: str | None
    priority: int
    spot: bool
    autoscaling: dict | None
    state: str
    created_at: datetime
    updated_at: datetime
    reason: str | None = None
    tolerations: list[str] = field(default_factory=list)
    driver: str | None = None
    handle: dict | None = None
    version: int = 1
    members: list[Member] = field(default_factory=list)

    def node_name(self, m: Member) -> str:
        return f"{self.name}-{m.idx}"

    @property
    def live_members(self) -> list[Member]:
        return [m for m in self.members if m.live]

    def gang(self, gang: uuid.UUID) -> list[Member]:
        return [m for m in self.members if m.gang_id == gang]

    def member(self, allocation_id: uuid.UUID) -> Member | None:
        return next((m for m in self.members if m.allocation_id == allocation_id), None)

    def add_gang(self, count: int) -> list[Member]:
        """New members (state placing) after the highest index used: one gang."""
        first = max((m.idx for m in self.members), default=-1) + 1
        g = gang_id(self.id, first)
        new = [Member(member_id(self.id, i), i, g, "placing") for i in range(first, first + count)]
        self.members.extend(new)
        return new

    def shrink_to(self, count: int) -> list[Member]:
        """Pick the members to remove (highest index first, never index 0: it hosts the controller) and mark them
        draining; returns them."""
        live = sorted(self.live_members, key=lambda m: m.idx, reverse=True)
        going = [m for m in live if m.idx != 0][:max(0, len(live) - count)]
        for m in going:
            m.state = "draining"
        return going

    @property
    def all_active(self) -> bool:
        live = self.live_members
        return bool(live) and all(m.state in ("active", "ready") for m in live) and \
            all(m.address for m in live)

    @property
    def settled(self) -> bool:
        """Nothing of a scale step in flight: every live member ready."""
        return all(m.state == "ready" for m in self.live_members)

    @property
    def gone(self) -> bool:
        return all(m.state in ("released", "failed") for m in self.members)
