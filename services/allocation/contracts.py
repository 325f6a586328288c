"""Wire contract of the allocation service (contracts/asyncapi/allocation.yaml is generated from it)."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import Field

from services.billing.contracts import MeterTerms, PriceSnapshot
from services.node_agent.contracts import Guest, InstanceInfo
from services.storage.contracts import MAX_ATTACHED, ClassName, VolumeRef
from shared.contract import Message, ServiceContract
from shared.steps import Step
from shared.wire import StepCommand, StepFailure, Wire

State = Literal["REQUESTED", "ACTIVE", "INTERRUPTED", "RELEASING", "RELEASED", "FAILED"]
InterruptCategory = Literal["node_lost", "gpu_fault", "drain", "maintenance"]


class Scheduling(Wire):
    """What the tenant asked about placement, networking and its guest (passed on by the saga)."""
    priority: int = Field(default=0, ge=-1000, le=1000)
    spot: bool = False
    pool: str | None = Field(default=None, max_length=63)
    tolerations: list[str] = Field(default_factory=list, max_length=16)
    fail_fast: bool = False
    network_id: uuid.UUID | None = None
    guest: Guest | None = Field(default=None, description="The image and first-boot data (VM slices and bare metal).")
    volumes: list[VolumeRef] = Field(default_factory=list, max_length=MAX_ATTACHED,
                                     description="Existing volumes of the tenant to mount, each at /mnt/<name>.")
    scratch_class: ClassName | None = Field(default=None, description="The storage class of the scratch volume "
                                                                      "(volume_gb); none: the provider's default.")
    price: PriceSnapshot | None = Field(default=None, description="The GPU-hour price quoted when the allocation "
                                                                  "was created (billing rates its usage with it).")


class RequestAllocation(Scheduling):
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID
    name: str = Field(max_length=63)
    shape: str
    gpu_count: int = Field(ge=1, le=16)
    volume_gb: int = Field(ge=0, le=100_000)
    labels: dict[str, str] = Field(default_factory=dict)


class ReleaseAllocation(Wire):
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    requested_by: uuid.UUID
    withdrawn: bool = Field(default=False, description=(
        "Set only by the saga coordinator, for an allocation it withdrew before its allocate saga started: the one "
        "release a REQUESTED allocation accepts (any other is refused while its allocate saga may run)."))


class PreemptAllocation(Wire):
    """Sent by the scheduler after a preemption notice's grace period: release the allocation, recording why."""
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    reason: str = Field(max_length=500)
    preempted_for: uuid.UUID | None = None


class InterruptAllocation(Wire):
    """Sent by the scheduler for each allocation on a node that failed: the allocation is rescheduled (or given
    up, past the retry policy's bound for the category)."""
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    node_id: uuid.UUID = Field(description="The node the allocation was on (a stale interrupt for another is a no-op).")
    category: InterruptCategory
    reason: str = Field(max_length=2000, description="What failed, for the tenant.")
    interrupted_at: datetime = Field(description="When the tenant lost the allocation: the fault's time, before now.")
    next: str = Field(max_length=500, description="What happens next, for the tenant.")


class ActivateAllocation(StepCommand):
    node_id: uuid.UUID
    instance: InstanceInfo | None = None
    gpu_model: str | None = Field(default=None, max_length=64, description="The reserved GPUs' model.")
    pool: str | None = Field(default=None, max_length=64, description="The pool the slots were reserved in.")


class FailAllocation(Wire):
    allocation_id: uuid.UUID
    saga_id: uuid.UUID
    failed_step: str
    reason: str


class MarkReleased(StepCommand):
    pass


class AllocationEvent(Wire):
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    state: State
    at: datetime


class AllocationRequested(AllocationEvent, Scheduling):
    user_id: uuid.UUID
    name: str
    shape: str
    gpu_count: int
    volume_gb: int
    labels: dict[str, str] = Field(default_factory=dict)


class AllocationActivated(AllocationEvent, MeterTerms):
    """The allocation is ACTIVE (the activate step's reply), with what billing meters it by from ``at``: billing
    starts its meter on this event (no shape nor GPUs: a reply recorded before it told them)."""
    saga_id: uuid.UUID
    step: str
    idempotency_key: str
    node_id: uuid.UUID
    instance: InstanceInfo | None = Field(default=None, description="What runs on the node (absent before VM slices).")
    shape: str | None = None
    gpu_count: int | None = Field(default=None, ge=1, le=16)


class AllocationActivationFailed(StepFailure):
    pass


class AllocationInterrupted(AllocationEvent, Scheduling):
    """The allocation lost its node and waits to be rescheduled: what the tenant is told, and all a reschedule
    needs to place it again without asking (the request's spec and options, as allocation.requested has them)."""
    state: Literal["INTERRUPTED"] = "INTERRUPTED"
    node_id: uuid.UUID = Field(description="The node it lost.")
    category: InterruptCategory
    reason: str
    interrupted_at: datetime = Field(description="When the tenant lost it.")
    next: str = Field(description="What happens next, for the tenant.")
    attempt: int = Field(ge=1, description="The reschedule this starts, 1-based.")
    user_id: uuid.UUID
    shape: str
    gpu_count: int
    volume_gb: int
    labels: dict[str, str] = Field(default_factory=dict)


class AllocationRescheduled(AllocationEvent):
    """The interrupted allocation is ACTIVE again on another node (same id), published with the activate
    step's reply."""
    state: Literal["ACTIVE"] = "ACTIVE"
    from_node_id: uuid.UUID
    to_node_id: uuid.UUID
    interrupted_at: datetime
    gap_s: float = Field(ge=0, description="Seconds from interrupted_at until it was ACTIVE again.")
    attempt: int = Field(ge=1)
    instance: InstanceInfo | None = Field(default=None, description="What runs on the new node.")


class AllocationReleaseRequested(AllocationEvent):
    requested_by: uuid.UUID | None = None
    reason: str | None = Field(default=None, description="Why, when not the tenant's own request (e.g. preempted).")
    node_id: uuid.UUID | None = None
    volume_gb: int = 0
    labels: dict[str, str] = Field(default_factory=dict)


class AllocationReleased(AllocationEvent):
    saga_id: uuid.UUID
    step: str
    idempotency_key: str


class AllocationReleaseFailed(StepFailure):
    """The mark_released step was refused (fault injection, a compensated key, an allocation not releasing)."""


class AllocationFailed(AllocationEvent):
    failed_step: str
    reason: str


class AllocationCommandRejected(Wire):
    allocation_id: uuid.UUID
    command: str
    reason: str


# --- what the sagas ask of the allocation: a notice (nothing to wait for) and two steps -----------------
ACTIVATE = Step.declare(
    "allocation",
    command=("activate", ActivateAllocation, "Last allocate-saga step: the allocation becomes ACTIVE."),
    ok=("activated", AllocationActivated, "The allocation is ACTIVE."),
    failed=("activation_failed", AllocationActivationFailed, "The activate step was refused."),
)
MARK_RELEASED = Step.declare(
    "allocation",
    command=("mark_released", MarkReleased, "Last release-saga step: the allocation becomes RELEASED."),
    ok=("released", AllocationReleased, "The allocation is RELEASED."),
    failed=("release_failed", AllocationReleaseFailed, "The mark_released step was refused."),
)
FAIL_ALLOCATION = Step.declare(
    "allocation", command=("fail", FailAllocation, "The saga ended in failure (after compensating)."))


CONTRACT = ServiceContract(
    service="allocation",
    title="Tessera allocation service",
    description=(
        "Owns the Allocation aggregate: REQUESTED → ACTIVE → RELEASING → RELEASED, or FAILED with a reason; "
        "ACTIVE → INTERRUPTED → ACTIVE when its node fails and it is rescheduled."
    ),
    messages=[
        Message("allocation.request", "allocation.cmd.request", RequestAllocation, "command",
                "A tenant asks for an allocation (sent by the gateway)."),
        Message("allocation.release", "allocation.cmd.release", ReleaseAllocation, "command",
                "A tenant asks to release an ACTIVE allocation (sent by the gateway), or one withdrawn from its tenant's line "
                "before it started (sent by the saga coordinator)."),
        Message("allocation.preempt", "allocation.cmd.preempt", PreemptAllocation, "command",
                "The scheduler preempts an ACTIVE allocation: release it, recording the reason."),
        Message("allocation.interrupt", "allocation.cmd.interrupt", InterruptAllocation, "command",
                "The allocation's node failed (sent by the scheduler): ACTIVE → INTERRUPTED, or FAILED once the "
                "retry policy's bound for the category is reached."),
        Message("allocation.requested", "allocation.evt.requested", AllocationRequested, "event",
                "An allocation was requested (REQUESTED)."),
        Message("allocation.interrupted", "allocation.evt.interrupted", AllocationInterrupted, "event",
                "The allocation lost its node and is being rescheduled (INTERRUPTED)."),
        Message("allocation.rescheduled", "allocation.evt.rescheduled", AllocationRescheduled, "event",
                "The interrupted allocation is ACTIVE again on a new node (with the activate step's reply)."),
        Message("allocation.release_requested", "allocation.evt.release_requested", AllocationReleaseRequested, "event",
                "Release was requested (RELEASING)."),
        Message("allocation.failed", "allocation.evt.failed", AllocationFailed, "event",
                "The allocation FAILED; the step and reason are recorded."),
        Message("allocation.command_rejected", "allocation.evt.command_rejected", AllocationCommandRejected, "event",
                "A command did not apply to the allocation's state."),
    ],
    receives=["allocation.request", "allocation.release", "allocation.preempt", "allocation.interrupt"],
    steps=[ACTIVATE, MARK_RELEASED, FAIL_ALLOCATION],
)
