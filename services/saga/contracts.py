"""Wire contract of the saga coordinator (its own events; the commands it sends belong to the participants)."""
from __future__ import annotations

import uuid
from typing import Literal

from shared.contract import Message, ServiceContract
from shared.wire import Wire

SagaKind = Literal["allocate", "release"]


class SagaStarted(Wire):
    saga_id: uuid.UUID
    kind: SagaKind
    allocation_id: uuid.UUID
    steps: list[str]


class SagaStepChanged(Wire):
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


CONTRACT = ServiceContract(
    service="saga",
    title="Tessera saga coordinator",
    description="Runs the allocate and release sagas: persists each step before sending it, compensates in reverse on failure or timeout.",
    messages=[
        Message("saga.started", "saga.evt.started", SagaStarted, "event", "A saga started."),
        Message("saga.step_changed", "saga.evt.step_changed", SagaStepChanged, "event", "A step changed status."),
        Message("saga.completed", "saga.evt.completed", SagaCompleted, "event", "Every step succeeded."),
        Message("saga.failed", "saga.evt.failed", SagaFailed, "event", "A step failed or timed out; the completed steps were compensated."),
        Message("saga.compensation_failed", "saga.evt.compensation_failed", CompensationFailed, "event", "Operator attention: an undo failed after all retries."),
    ],
    receives=[
        "allocation.requested", "allocation.release_requested",
        "scheduler.slots_reserved", "scheduler.reservation_queued", "scheduler.slot_reservation_failed",
        "scheduler.slots_released",
        "network.network_attached", "network.network_attach_failed", "network.network_detached",
        "storage.volume_provisioned", "storage.volume_provision_failed", "storage.volume_deleted",
        "node_agent.node_provisioned", "node_agent.node_provision_failed", "node_agent.node_deprovisioned",
        "billing.meter_started", "billing.meter_start_failed", "billing.meter_stopped",
        "allocation.activated", "allocation.activation_failed", "allocation.released", "allocation.release_failed",
    ],
    sends=[
        "allocation.mark_provisioning", "allocation.activate", "allocation.fail", "allocation.mark_released",
        "scheduler.reserve_slots", "scheduler.release_slots", "network.attach_network", "network.detach_network",
        "storage.provision_volume", "storage.delete_volume", "node_agent.provision", "node_agent.deprovision",
        "billing.start_meter", "billing.stop_meter",
    ],
)
