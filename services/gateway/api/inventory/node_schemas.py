"""HTTP models of nodes: registration, the list, a node's whole document, slot-map approval and changes."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from ...http.schema_base import (
    Body,
    GpuModel,
    Int,
    Labels,
    Out,
    Problem,
    Rejection,
    ResourceName,
    ShapeName,
    Taints,
    omittable,
    text,
)

NodeStatus = Literal["registering", "registered", "pending_approval", "burn_in", "burn_in_failed", "schedulable",
                     "needs_review", "rejected"]
Location = text(63, min_length=1)
WipePolicy = text(64)
Reason = text(500, multiline=True)
NODE_CHANGES = ("pool", "labels", "taints", "cordoned")   # what PATCH /v1/nodes/{node_id} changes (one at least)


# --- requests ---------------------------------------------------------------------------------------

class NodeCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"id", "status", "requested_at", "requested_by", "registered_at", "slots", "links"})
    name: ResourceName
    gpu_model: GpuModel = Field(description="As quotas name it (PUT /v1/tenants/{tenant_id}/quotas/{pool}/{gpu_model}).")
    gpu_count: Int = Field(ge=1, le=16)
    labels: Labels = Field(default_factory=dict)
    pool: ShapeName | None = Field(default=None, description="The node pool (default: shared).")
    region: Location | None = None
    site: Location | None = None
    rack: Location | None = None


class SlotMapApproval(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"approved_by", "node_id"})
    proposal: Int = Field(ge=1, le=2**31 - 1,
                          description="The proposal number shown by GET /v1/nodes/{node_id}; a stale one is a 409.")
    wipe_policy: WipePolicy | None = Field(
        default=None, description="Overrides every slot's wipe policy; an empty string makes none schedulable.")


class NodePatch(Body):
    """At least one of pool, labels, taints and cordoned; a field left out is kept (null is refused: leave it out)."""

    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"id", "name", "status", "gpu_model", "gpu_count", "proposal", "version", "requested_by"})
    model_config = ConfigDict(json_schema_extra={"anyOf": [{"required": [f]} for f in NODE_CHANGES]})
    pool: ShapeName = omittable()
    labels: Labels = omittable()
    taints: Taints = omittable()
    cordoned: bool = omittable()
    reason: Reason = omittable()

    @model_validator(mode="after")
    def _changes_something(self) -> NodePatch:
        if not self.model_fields_set & set(NODE_CHANGES):
            raise ValueError(f"nothing to change: send {', '.join(NODE_CHANGES)}")
        return self


# --- responses --------------------------------------------------------------------------------------

class _NodeFields(Out):
    """What every view of a node carries."""

    id: uuid.UUID
    name: str
    gpu_model: str
    gpu_count: int
    labels: dict[str, str]
    status: NodeStatus


class NodeOut(_NodeFields):
    """A node as requested and, once the scheduler confirmed it, registered."""

    requested_at: datetime | None = None
    registered_at: datetime | None = None


class NodeList(Out):
    """Every node, by name."""

    items: list[NodeOut]


class QuarantinedSlot(Out):
    """A slot out of service: its wipe failed at a release. A provider admin's successful re-wipe
    (POST /v1/nodes/{node_id}/slots/{slot}/rewipe) returns it."""

    slot: int
    reason: str
    since: datetime | None = None


class BurnInCheck(Out):
    name: str
    ok: bool
    detail: str = ""


class BurnIn(Out):
    """The node's last burn-in run: `running`, then `passed` (the node is schedulable) or `failed` (it is
    `burn_in_failed`, the failed checks named in `review`)."""

    run_id: uuid.UUID
    state: Literal["running", "passed", "failed"]
    checks: list[BurnInCheck] = Field(default_factory=list)
    requested_by: uuid.UUID | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def shown(cls, stored: dict) -> BurnIn:
        """From the stored document: only the members this API shows (the scheduler's may gain more)."""
        checks = [{k: c[k] for k in BurnInCheck.model_fields if k in c} for c in stored.get("checks") or []]
        return cls(**{k: v for k, v in stored.items() if k in cls.model_fields and k != "checks"}, checks=checks)


class NodeBmc(Out):
    """The node's BMC as its document shows it (GET /v1/nodes/{node_id}/bmc has the rest); never the password."""

    url: str
    system_id: str
    username: str
    password_set: bool


class NodeDetail(_NodeFields):
    """A node's whole document as the scheduler last published it (and the gateway's registration times)."""

    pool: str
    region: str | None = None
    site: str | None = None
    rack: str | None = None
    taints: dict[str, str]
    cordoned: bool
    proposal: int | None = Field(default=None, description="The slot-map proposal awaiting approval.")
    proposed_slot_map: dict[str, Any] | None = None
    approved_slot_map: dict[str, Any] | None = None
    review: list[str] = Field(description="Why the node needs review (discovery differs from the approved map), or "
                                          "which burn-in checks failed (`burn_in_failed`).")
    free_slots: int = Field(description="Slots no allocation holds (whole GPUs with a wipe policy, not retired, no MIG "
                                        "instance) while the node is schedulable, else 0: the scheduler's count "
                                        "after its latest reservation or release on the node.")
    version: int = Field(description="The scheduler document's version: raised by changes of the node itself "
                                     "(status, slot map, pool, labels, taints, cordon), not by slots taken or "
                                     "freed; 0 before the first document.")
    capacity_version: int = Field(default=0, description="The node's capacity sequence free_slots was counted at: "
                                  "raised by every reservation, release and slot-map approval on the node; 0 "
                                  "before the first count.")
    last_rejection: Rejection | None = None
    quarantined: list[QuarantinedSlot] = Field(default_factory=list, description="Slots out of service because "
                                               "their wipe failed; a successful re-wipe returns them.")
    burn_in: BurnIn | None = Field(default=None, description="The node's last burn-in run (POST "
                                   "/v1/nodes/{node_id}/burn-in runs it again).")
    bmc: NodeBmc | None = Field(default=None, description="The node's BMC (bare metal through Redfish), if one is "
                                "registered.")
    requested_at: datetime | None = None
    registered_at: datetime | None = None
    changed_at: datetime | None = None


class ProposalProblem(Problem):
    """409: the node is not awaiting approval of this proposal."""

    current_proposal: int | None
    node_status: NodeStatus
