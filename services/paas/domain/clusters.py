"""A tenant cluster and its nodes (pure): how it moves from placed to ready, scales and goes away.

A cluster's nodes are allocations of its tenant, one per member. Members are added a gang at a time (the
creation, then each scale-out step): the scheduler places a gang whole or not at all, then each member runs the
ordinary allocate saga. The member's allocation id is derived from the cluster and its index, so a redelivered
command never makes a second allocation.

States: placing → (queued →) provisioning → starting → ready; ready → scaling → ready; any → deleting → deleted;
failed when the first gang is refused or a first node fails (the rest is released). A failure during a scale
step leaves the cluster ready with the reason, and the failed member released.

A cluster may instead be made of allocations its tenant already holds (``adopt``): those members are ``adopted``,
start ``active`` with their addresses (no gang, nothing requested), and are never released by the cluster: a
scale-in or a delete drains them and takes them out of the cluster's scheduler, then they are ``returned`` (the
allocation stays ACTIVE, the tenant's as before). Scale-out still adds new members as a gang.

A node lost with its host (its allocation INTERRUPTED, then rescheduled under the same id): the member is
``lost`` (still one of the cluster's nodes) and the cluster ``scaling`` (one change at a time); ACTIVE again with
its address, it is ``rejoining`` until the scheduler has it back, then ``ready``. Its allocation FAILED instead:
the cluster shrinks, or fails when it was ``nodes[0]`` (the controller).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

LIVE_MEMBER = frozenset({"placing", "provisioning", "active", "joining", "ready", "draining", "lost", "rejoining"})
AWAY = frozenset({"lost", "rejoining"})      # a node the scheduler cannot count on until it is replaced
ENDED_MEMBER = frozenset({"released", "failed", "returned"})   # returned: an adopted allocation given back
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
    adopted: bool = False           # the tenant's before the cluster: returned, never released, when it leaves

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

    def adopt(self, nodes: list[tuple[uuid.UUID, uuid.UUID, uuid.UUID | None, str]]) -> list[Member]:
        """Members of allocations the tenant holds, ``(allocation_id, node_id, attachment_id, address)`` in node
        order, ``active`` with their addresses; the cluster is ``starting`` once every live member is."""
        first = max((m.idx for m in self.members), default=-1) + 1
        g = gang_id(self.id, first)      # no gang is reserved: the id only groups them
        new = [Member(alloc, first + i, g, "active", node_id=node, attachment_id=attachment, address=address,
                      adopted=True) for i, (alloc, node, attachment, address) in enumerate(nodes)]
        self.members.extend(new)
        if self.all_active:
            self.state = "starting"
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
        return all(m.state in ENDED_MEMBER for m in self.members)

    # ---- a node lost with its host
    def lose(self, m: Member, why: str) -> bool:
        """``m``'s allocation was interrupted: it is lost until it is ACTIVE again elsewhere. Its old address and
        slot are forgotten (the reschedule attaches it again). False when ``m`` is no node the cluster counts on."""
        if m.state not in ("active", "joining", "ready") or self.state in ("deleting", "deleted", "failed"):
            return False
        m.state, m.reason = "lost", why
        m.address = m.attachment_id = m.node_id = None
        self.reason = f"node {self.node_name(m)} lost: {why}; waiting for it on another node"
        if self.state == "starting":            # the start waits for it, as for any first node
            self.state = "provisioning"
        elif self.state == "ready":
            self.state = "scaling"
        return True

    def back(self, m: Member) -> bool:
        """A lost member with both its new address and its new node (they arrive in either order): ``rejoining``
        (the reconciler replaces it in the scheduler), or ``active`` when the scheduler was never started."""
        if m.state != "lost" or not (m.address and m.node_id):
            return False
        m.state = "rejoining" if self.handle else "active"
        self.reason = f"node {self.node_name(m)} is back on another node; rejoining the cluster"
        if self.state == "provisioning" and self.all_active:
            self.state = "starting"
        return True

    def not_replaced(self, m: Member, why: str) -> None:
        """A lost member's allocation FAILED (no reschedule found room): the cluster goes on without it, or fails
        (its other nodes released) when it hosted the controller or was the last."""
        m.state, m.reason = "failed", why
        name = self.node_name(m)
        if m.idx == 0 or not self.live_members:
            self.state, self.reason = "deleting", f"node {name} (the controller) lost and not replaced: {why}"
            return
        self.node_count = len(self.live_members)
        self.reason = f"node {name} lost and not replaced: {why}; the cluster goes on with {self.node_count} node(s)"
        if self.state == "ready":
            self.state = "scaling"                 # the reconciler takes it out of the scheduler


def lost_job(kind: str, node: str, why: str) -> tuple[str, str]:
    """What becomes of a job that ran on ``node`` when it is lost: ``(state, reason)``. Slurm requeues a batch job
    whose node failed (``JobRequeue=1``) and Kubernetes' Job controller makes its pods again: PENDING. A Ray job's
    driver process died with its node and Ray does not restart it: FAILED."""
    if kind == "ray":
        return "FAILED", f"node {node} lost: the job's driver died with it ({why})"
    return "PENDING", f"requeued: node {node} lost ({why})"
