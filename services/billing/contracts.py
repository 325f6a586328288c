"""Wire contract of the billing service (meters per allocation)."""
from __future__ import annotations

import uuid
from datetime import datetime

from shared.contract import ServiceContract
from shared.steps import Step
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand


class StartMeter(StepCommand):
    shape: str
    gpu_count: int


class MeterStarted(StepReply):
    meter_id: uuid.UUID
    started_at: datetime


class MeterStartFailed(StepFailure):
    pass


class StopMeter(UndoCommand):
    pass


class MeterStopped(StepUndone):
    meter_id: uuid.UUID | None = None
    gpu_seconds: float = 0.0


START_METER = Step.declare(
    "billing",
    command=("start_meter", StartMeter, "Saga step: start metering the allocation."),
    ok=("meter_started", MeterStarted, "The meter runs."),
    failed=("meter_start_failed", MeterStartFailed, "The meter could not be started."),
    undo=("stop_meter", StopMeter, "Saga step or compensation: stop the allocation's meter (idempotent)."),
    undone=("meter_stopped", MeterStopped, "The meter is stopped; GPU-seconds recorded."),
)


CONTRACT = ServiceContract(
    service="billing",
    title="Tessera billing service",
    description="Starts and stops a usage meter per allocation.",
    messages=[],
    steps=[START_METER],
)
