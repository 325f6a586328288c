"""Wire contract of the saga coordinator: its own events. The commands it sends and the replies it receives
belong to the participants; they follow from the steps its saga table names (domain/definitions.py)."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import Field

from shared.contract import Message, ServiceContract
from shared.wire import Wire

from .domain.definitions import sent_and_received

SagaKind = Literal["allocate", "release", "reschedule"]


class SagaStarted(Wire):
    saga_id: uuid.UUID
    kind: SagaKind
    allocation_id: uuid.UUID
    steps: list[str]


class SagaStepChanged(Wire):
    """A step change no command or reply states: timed out, retrying, given up (failed), skipped (succeeded, "skipped: ...")."""

    saga_id: uuid.UUID
    kind: SagaKind
    allocation_id: uuid.UUID
    step: str
    status: Literal["invoked", "waiting", "succeeded", "failed", "timed_out", "compensating", "compensated", "retrying"]
    attempt: int
    detail: str | None = None
    phase: Literal["invoke", "compensate"] = "invoke"   # "compensate": the status is that of the step's undo


class SagaCompleted(Wire):
    saga_id: uuid.UUID
    kind: SagaKind
    allocation_id: uuid.UUID


class SagaFailed(Wire):
    saga_id: uuid.UUID
    kind: SagaKind
    allocation_id: uuid.UUID
    failed_step: str
    reason: str
    compensated: list[str]


class CompensationFailed(Wire):
    """Operator-visible: an undo could not be confirmed after every retry; a human must look."""

    saga_id: uuid.UUID
    kind: SagaKind
    allocation_id: uuid.UUID
    step: str
    attempts: int
    reason: str


class AllocationWaiting(Wire):
    """The allocation waits in its tenant's line (TESSERA_SAGA_TENANT_INFLIGHT of its allocate sagas are in
    flight): told when it joins, and as its place changes (within the first places every change, further back
    each halving: services/saga/domain/lines.py, ``retell``)."""

    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    position: int = Field(ge=1, description="Its place in its tenant's line: 1 = the next to start.")
    reason: Literal["tenant_line"] = "tenant_line"


class AllocationLeftLine(Wire):
    """The allocation left its tenant's line: its allocate saga started (told only to one that waited in it, whose
    view would otherwise show its last place until the scheduler placed or queued it)."""

    allocation_id: uuid.UUID
    tenant_id: uuid.UUID


class WithdrawAllocation(Wire):
    """A tenant releases an allocation whose allocate saga may not have started (REQUESTED): the coordinator
    drops it from its tenant's line and has it released at once, or has it released once its saga completes."""

    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    requested_by: uuid.UUID


class ReadSteps(Wire):
    """Every saga of an allocation, with when each of its steps ran (the caller checks who may see it)."""

    allocation_id: uuid.UUID


class StepTiming(Wire):
    step: str
    phase: Literal["invoke", "compensate"] = Field(description="compensate: the step's undo.")
    status: str = Field(description="The record's status (a skipped step: succeeded, attempt 0; an undo never "
                                    "needed: armed; one not needed as its step failed: disarmed).")
    attempt: int = Field(description="How many times its command was sent (0: never, it was skipped).")
    started_at: datetime | None = Field(description="When its command was first sent.")
    finished_at: datetime | None = Field(description="When it succeeded, failed, timed out or was compensated.")
    duration_s: float | None = Field(description="finished_at - started_at; null while it runs (or never ran).")
    error: str | None = None


class SagaSteps(Wire):
    saga_id: uuid.UUID
    kind: SagaKind
    state: Literal["running", "compensating", "completed", "failed"]
    started_at: datetime
    finished_at: datetime | None = Field(description="When it completed or failed; null while it runs.")
    steps: list[StepTiming] = Field(description="In the saga's order, each step's undo right after it.")


class AllocationSagas(Wire):
    items: list[SagaSteps] = Field(description="Every saga of the allocation, oldest first.")


_SENDS, _RECEIVES = sent_and_received()

CONTRACT = ServiceContract(
    service="saga",
    title="Tessera saga coordinator",
    description=(
        "Runs the allocate, release and reschedule sagas: persists each step before sending it, compensates in "
        "reverse on failure or timeout."
    ),
    messages=[
        Message("saga.started", "saga.evt.started", SagaStarted, "event", "A saga started."),
        Message("saga.step_changed", "saga.evt.step_changed", SagaStepChanged, "event",
                "A step change no other message states: timed out, retrying, given up (failed) or skipped."),
        Message("saga.completed", "saga.evt.completed", SagaCompleted, "event", "Every step succeeded."),
        Message("saga.failed", "saga.evt.failed", SagaFailed, "event",
                "A step failed or timed out; the completed steps were compensated."),
        Message("saga.compensation_failed", "saga.evt.compensation_failed", CompensationFailed, "event",
                "Operator attention: an undo failed after all retries."),
        Message("saga.allocation_waiting", "saga.evt.allocation_waiting", AllocationWaiting, "event",
                "The allocation waits in its tenant's line, at this place."),
        Message("saga.allocation_left_line", "saga.evt.allocation_left_line", AllocationLeftLine, "event",
                "The allocation that waited in its tenant's line left it: its allocate saga started."),
        Message("saga.withdraw", "saga.cmd.withdraw", WithdrawAllocation, "command",
                "Release an allocation not started yet: out of its tenant's line at once, or once its saga completes "
                "(sent by the gateway)."),
        Message("saga.read_steps", "saga.rpc.read_steps", ReadSteps, "request",
                "Every saga of an allocation and when each of its steps ran (asked by the gateway).",
                reply=AllocationSagas),
    ],
    # besides the saga starts: the replies of the steps the saga table names, whose commands it sends
    receives=["allocation.requested", "allocation.release_requested", "allocation.interrupted", "saga.withdraw",
              *_RECEIVES],
    # allocation.release: a withdrawn allocation's release (services/saga/handlers/withdrawals.py)
    sends=[*_SENDS, "allocation.release"],
)
