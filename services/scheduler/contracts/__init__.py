"""Wire contract of the scheduler service: inventory, slot maps, shapes, pools, quotas, placement, queue, preemption.

Inventory changes arrive as commands (from the gateway for provider/tenant
admins, from node-agents for discovered topology); every change of an entity is
published as one ``*_changed`` event carrying the entity's whole document, so
read models (the gateway's, ops dashboards) never need to merge partial updates.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from shared.contract import Message, ServiceContract
from shared.steps import Step
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand, Wire

from .gang import CancelGang, GangPlaced, GangQueued, GangRejected, ReserveGang
from .health import BreakerChanged, CloseBreaker, DrainNode, HealthPolicyChanged, NodeHealthChanged, SetHealthPolicy

NAME = r"^[a-z0-9]([a-z0-9.\-]{0,61}[a-z0-9])?$"
# The shapes the platform ships with, by GPU count (the scheduler seeds them; admins add or remove shapes later).
SHAPES: dict[str, int] = {"vm.1gpu": 1, "vm.2gpu": 2, "vm.4gpu": 4, "vm.8gpu": 8, "bm.8gpu": 8}
NodeStatus = Literal["registered", "pending_approval", "burn_in", "burn_in_failed", "schedulable", "needs_review"]
TargetKind = Literal["node", "shape", "pool", "quota", "allocation"]   # what an admin command is about
FailureCode = Literal["no-capacity", "quota-exceeded", "queue-full", "cancelled", "unknown-shape", "invalid-request",
                      "preempted"]


# --- inventory commands ---------------------------------------------------------------------------------------
class RegisterNode(Wire):
    """A provider admin declares a node: where it is, which pool; its hardware comes from discovery."""
    node_id: uuid.UUID
    name: str = Field(min_length=1, max_length=63)
    gpu_model: str = Field(min_length=1, max_length=64)
    gpu_count: int = Field(ge=1, le=16)
    labels: dict[str, str] = Field(default_factory=dict)
    pool: str = Field(default="shared", pattern=NAME)
    region: str = Field(default="region-1", max_length=63)
    site: str = Field(default="site-1", max_length=63)
    rack: str = Field(default="rack-1", max_length=63)


class ReportTopology(Wire):
    """Sent by a node-agent at start (and on re-discovery): the hardware its driver found."""
    node_id: uuid.UUID
    driver: str
    topology: dict[str, Any] = Field(description="services.scheduler.domain.topology.NodeTopology.to_dict()")


class ApproveSlotMap(Wire):
    node_id: uuid.UUID
    proposal: int = Field(ge=1, description="The proposal number being approved; a stale one is rejected.")
    approved_by: uuid.UUID
    wipe_policy: str | None = Field(default=None, max_length=64,
                                    description="Overrides every slot's wipe policy; empty string = none (unschedulable).")


class UpdateNode(Wire):
    node_id: uuid.UUID
    pool: str | None = Field(default=None, pattern=NAME)
    labels: dict[str, str] | None = None
    taints: dict[str, str] | None = Field(default=None, description="key -> 'value:NoSchedule'")
    cordoned: bool | None = None
    reason: str | None = Field(default=None, max_length=500)
    requested_by: uuid.UUID


class DefineShape(Wire):
    name: str = Field(pattern=NAME)
    kind: Literal["bare_metal", "vm", "mig"]
    gpu_count: int = Field(ge=1, le=16)
    gpu_model: str | None = Field(default=None, max_length=64)
    mig_profile: str | None = Field(default=None, max_length=32)
    deleted: bool = False


class DefinePool(Wire):
    name: str = Field(pattern=NAME)
    policy: Literal["pack", "spread"] = "pack"
    taints: dict[str, str] = Field(default_factory=dict)
    description: str = Field(default="", max_length=500)


class SetQuota(Wire):
    """Provider admin: a tenant's limit on GPUs of one model in one pool; ``user_id`` set = a tenant admin's split."""
    tenant_id: uuid.UUID
    gpu_model: str = Field(min_length=1, max_length=64)
    pool: str = Field(pattern=NAME)
    limit: int = Field(ge=0, le=1_000_000)
    guaranteed: int = Field(default=0, ge=0, le=1_000_000)
    user_id: uuid.UUID | None = None
    set_by: uuid.UUID


class CancelRequest(Wire):
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    requested_by: uuid.UUID


# --- inventory events -----------------------------------------------------------------------------------------
class NodeCapacity(Wire):
    """A node's free slots after a change, in the node's own order: what every message that takes or frees
    slots carries (slots_reserved, slots_released) and the node document too, so a read model follows
    capacity without a message of its own."""
    free_slots: int = Field(ge=0, description="Slots of the node no allocation holds, whole (no MIG instance), "
                                              "with a wipe policy, not retired; counted whatever the node's status.")
    seq: int = Field(ge=0, description="The node's capacity sequence the count was taken at: raised by one in "
                                       "the transaction of every claim, release and slot-map install on the node, "
                                       "in commit order. A read model keeps the count with the highest seq.")


class NodeRegistered(Wire):
    node_id: uuid.UUID
    name: str
    gpu_model: str
    gpu_count: int


class QuarantinedSlotState(Wire):
    slot: int
    reason: str
    since: datetime | None = None


class BurnInState(Wire):
    run_id: uuid.UUID
    state: Literal["running", "passed", "failed"]
    checks: list[dict[str, Any]] = Field(default_factory=list, description="name, ok, detail per check.")
    requested_by: uuid.UUID | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class RunBurnInRequest(Wire):
    """A provider admin re-runs the node's burn-in (the node leaves service until it passes)."""
    node_id: uuid.UUID
    requested_by: uuid.UUID


class SlotStateChanged(Wire):
    """Operator event: a slot was quarantined (its wipe failed) or returned to service (a re-wipe passed)."""
    node_id: uuid.UUID
    slot: int
    state: Literal["quarantined", "returned"]
    reason: str = Field(default="", max_length=2000)
    allocation_id: uuid.UUID | None = None


class NodeChanged(Wire):
    node_id: uuid.UUID
    name: str
    status: NodeStatus
    pool: str
    region: str
    site: str
    rack: str
    gpu_model: str
    gpu_count: int
    labels: dict[str, str] = Field(default_factory=dict)
    taints: dict[str, str] = Field(default_factory=dict)
    cordoned: bool = False
    proposal: int | None = Field(default=None, description="Number of the slot-map proposal awaiting approval.")
    proposed_slot_map: dict[str, Any] | None = None
    approved_slot_map: dict[str, Any] | None = None
    review: list[str] = Field(default_factory=list, description="Why the node needs review (discovery differs), "
                                                               "or which burn-in checks failed.")
    quarantined: list[QuarantinedSlotState] = Field(default_factory=list, description="Slots out of service: their "
                                                    "wipe failed; a provider admin's successful re-wipe returns them.")
    burn_in: BurnInState | None = Field(default=None, description="The node's last burn-in run.")
    free_slots: int = Field(default=0, description="The node's free slots while it is schedulable, else 0.")
    version: int = Field(ge=1, description="The document's version: raised by each change of the node itself, not "
                                           "by slots taken or freed (those raise capacity.seq).")
    capacity: NodeCapacity | None = Field(default=None, description="The free slots whatever the status, and the "
                                          "capacity sequence they were counted at (absent from older documents).")


class ShapeChanged(DefineShape):
    version: int = Field(ge=1)


class PoolChanged(DefinePool):
    version: int = Field(ge=1)


class QuotaChanged(Wire):
    tenant_id: uuid.UUID
    gpu_model: str
    pool: str
    user_id: uuid.UUID | None = None
    limit: int
    guaranteed: int = 0
    used: int
    version: int = Field(ge=1)


QUOTA_USE_PER_MESSAGE = 256   # about 60 KB of JSON: well under the bus's 1 MB message limit


class QuotaUseChanged(Wire):
    """The quotas whose use changed since the last report, each as its whole ``quota_changed`` document, many in
    one message: at hundreds of decisions a second across a thousand tenants, one event per quota was most of
    the scheduler's messages. A quota appears at most once in a message."""
    quotas: list[QuotaChanged] = Field(min_length=1, max_length=QUOTA_USE_PER_MESSAGE)


class AdminCommandRejected(Wire):
    """The command changed nothing: refused by a rule, or data it can never store (at once, never after retries)."""
    command: str
    target: str = Field(description="What the command is about: a node or allocation id, a shape or pool name, "
                                    "a quota as '<tenant>/<gpu model>/<pool>[/<user>]'.")
    reason: str
    target_kind: TargetKind | None = Field(default=None, description="The kind of object the target is "
                                           "(absent from events sent before it existed).")


class SchedulingStats(Wire):
    """Periodic snapshot for ops dashboards (also on /metrics)."""
    at: datetime
    pending: dict[str, int] = Field(description="tenant id -> pending requests")
    utilisation: dict[str, list[int]] = Field(description="'pool/model' -> [used GPUs, total GPUs]")
    fragmentation: dict[str, float] = Field(description="'pool/model' -> share of free GPUs that cannot serve 8 GPUs")
    preemptions_total: int = 0
    spot_reserve: dict[str, int] = Field(default_factory=dict, description=(
        "pool -> GPUs tenants may claim there at any moment (unused guaranteed quota plus what pending non-spot "
        "requests wait for): what spot capacity must leave free"))


# --- saga step: reserve / release -----------------------------------------------------------------------------
class ReserveSlots(StepCommand):
    shape: str
    gpu_count: int = Field(ge=1, le=16)
    user_id: uuid.UUID | None = None
    priority: int = Field(default=0, ge=-1000, le=1000)
    spot: bool = False
    pool: str | None = None
    tolerations: list[str] = Field(default_factory=list)
    fail_fast: bool = False


class SlotDetail(Wire):
    index: int
    gpu_pci: str
    nvme_pci: str
    ib_vf_pci: str
    ib_guid: str
    numa: int
    nvlink_domain: int
    cpu_cores: int = Field(default=0, ge=0, description="The slot's share of its NUMA node's cores (0: unknown).")
    memory_gb: int = Field(default=0, ge=0, description="The slot's share of its NUMA node's memory (0: unknown).")
    wipe_policy: str | None = Field(default=None, max_length=64,
                                    description="How release wipes the slot (the approved map's policy).")


class SlotsReserved(StepReply):
    node_id: uuid.UUID
    slots: list[int]
    gpu_model: str
    pool: str = "shared"
    slot_details: list[SlotDetail] = Field(default_factory=list)
    waited_s: float = 0.0
    capacity: NodeCapacity | None = Field(default=None, description="The node's free slots after this reservation "
                                          "(absent from replies recorded before it existed; a repeated reply "
                                          "carries the count of its time, which its seq shows is old).")


class ReservationQueued(StepReply):
    """Progress reply: nothing fits now, the request waits in the queue (the saga extends its deadline)."""
    tenant_id: uuid.UUID
    position: int = Field(ge=1)
    reason: str


class SlotReservationFailed(StepFailure):
    code: FailureCode = "no-capacity"
    quota: str | None = None
    limit: int | None = None
    used: int | None = None
    requested: int | None = None


class QuarantineSlot(Wire):
    slot: int = Field(ge=0)
    reason: str = Field(max_length=2000)


class ReleaseSlots(UndoCommand):
    quarantine: list[QuarantineSlot] = Field(
        default_factory=list, description="Slots whose wipe failed: kept out of service (quarantined) with the "
                                          "reason instead of freed, until a provider admin's re-wipe succeeds.")


class SlotsReleased(StepUndone):
    slots_freed: int = 0
    node_id: uuid.UUID | None = Field(default=None, description="The node the slots were freed on (none: the "
                                      "allocation held nothing).")
    capacity: NodeCapacity | None = Field(default=None, description="The node's free slots after this release.")


RESERVE_SLOTS = Step.declare(
    "scheduler",
    command=("reserve_slots", ReserveSlots, "Saga step: reserve GPU slots for an allocation."),
    ok=("slots_reserved", SlotsReserved, "Slots were reserved for the allocation."),
    failed=("slot_reservation_failed", SlotReservationFailed, "No slots could be reserved (code says why)."),
    progress=("reservation_queued", ReservationQueued, "Nothing fits now: the request waits in the queue."),
    undo=("release_slots", ReleaseSlots, "Saga step or compensation: free the allocation's slots (idempotent)."),
    undone=("slots_released", SlotsReleased, "The allocation holds no slots."),
)


class PreemptionNotice(Wire):
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    node_id: uuid.UUID
    reason: str
    preempted_for: uuid.UUID
    grace_deadline: datetime


def _m(name: str, model, kind: str, summary: str) -> Message:
    return Message(f"scheduler.{name}", f"scheduler.{'cmd' if kind == 'command' else 'evt'}.{name}", model, kind, summary)


CONTRACT = ServiceContract(
    service="scheduler",
    title="Tessera scheduler service",
    description="Owns the GPU inventory, slot maps, shapes, pools and quotas; places and reserves allocations, "
                "queues what does not fit (fair share), preempts for higher priority.",
    messages=[
        _m("register_node", RegisterNode, "command", "A provider admin declares a node (location, pool)."),
        # on its node's subject, so the bus lets a node-agent report only its own node (tooling.bus_permissions)
        Message("scheduler.report_topology", "scheduler.cmd.report_topology.{node_id}", ReportTopology, "command",
                "A node-agent reports the hardware it discovered (on its node's subject)."),
        _m("approve_slot_map", ApproveSlotMap, "command", "A provider admin approves a node's proposed slot map."),
        _m("update_node", UpdateNode, "command", "A provider admin changes a node's pool, labels, taints or cordon."),
        _m("define_shape", DefineShape, "command", "A provider admin defines (or deletes) a capacity shape."),
        _m("define_pool", DefinePool, "command", "A provider admin defines a node pool and its policy."),
        _m("set_quota", SetQuota, "command", "A tenant's (or one of its users') GPU quota for a model and pool."),
        _m("cancel_request", CancelRequest, "command", "Cancel a pending (queued) reservation."),
        _m("run_burn_in", RunBurnInRequest, "command", "A provider admin re-runs a node's burn-in."),
        _m("slot_state_changed", SlotStateChanged, "event", "A slot was quarantined (wipe failed) or returned."),
        _m("node_registered", NodeRegistered, "event", "A node exists."),
        _m("node_changed", NodeChanged, "event", "A node's whole document after any change."),
        _m("shape_changed", ShapeChanged, "event", "A shape's whole document after any change."),
        _m("pool_changed", PoolChanged, "event", "A pool's whole document after any change."),
        _m("quota_changed", QuotaChanged, "event", "A quota's limit changed (set by an admin)."),
        _m("quota_use_changed", QuotaUseChanged, "event",
           "The use of every quota that changed since the last report, at most once a second, in batches."),
        _m("admin_command_rejected", AdminCommandRejected, "event", "An inventory command could not be applied."),
        _m("scheduling_stats", SchedulingStats, "event", "Periodic pending/utilisation/fragmentation snapshot."),
        _m("preemption_notice", PreemptionNotice, "event", "An allocation will be preempted after its grace period."),
        _m("set_health_policy", SetHealthPolicy, "command", "A provider admin sets how a health condition is classified."),
        _m("drain_node", DrainNode, "command", "A provider admin drains a node (now, or at a deadline)."),
        _m("close_breaker", CloseBreaker, "command", "A provider admin closes a pool's automatic-cordon breaker."),
        _m("node_health_changed", NodeHealthChanged, "event", "A node's whole health document after any change."),
        _m("health_policy_changed", HealthPolicyChanged, "event", "A health condition's classifications changed."),
        _m("breaker_changed", BreakerChanged, "event", "A pool's automatic-cordon breaker opened or closed."),
        _m("reserve_gang", ReserveGang, "command", "Reserve slots for N allocations, all or nothing."),
        _m("cancel_gang", CancelGang, "command", "Withdraw a waiting gang."),
        _m("gang_placed", GangPlaced, "event", "Every member of the gang holds its slots."),
        _m("gang_queued", GangQueued, "event", "The gang waits whole in the queue, holding nothing."),
        _m("gang_rejected", GangRejected, "event", "The gang was refused or withdrawn (code says why)."),
    ],
    receives=["scheduler.register_node", "scheduler.report_topology", "scheduler.approve_slot_map",
              "scheduler.update_node", "scheduler.define_shape", "scheduler.define_pool", "scheduler.set_quota",
              "scheduler.cancel_request", "scheduler.run_burn_in", "node_agent.burn_in_finished",
              "node_agent.slot_rewiped", "scheduler.set_health_policy", "scheduler.drain_node",
              "scheduler.close_breaker", "node_agent.heartbeat", "scheduler.reserve_gang", "scheduler.cancel_gang"],
    sends=["allocation.preempt", "node_agent.burn_in", "allocation.interrupt", "node_agent.fence_instances"],
    steps=[RESERVE_SLOTS],
)
