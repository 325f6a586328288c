"""HTTP models of nodes: registration, the list, a node's whole document, slot-map approval and changes."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints

from services.scheduler.contracts import NAME

from .base import Body, Labels, Out, Problem, Rejection, ResourceName, ShapeName, Taints

NodeStatus = Literal["registering", "registered", "pending_approval", "schedulable", "needs_review"]
InventoryName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=NAME)]


# --- requests ---------------------------------------------------------------------------------------

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


# --- responses --------------------------------------------------------------------------------------

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


class ProposalProblem(Problem):
    """409: the node is not awaiting approval of this proposal."""

    current_proposal: int | None
    node_status: str
