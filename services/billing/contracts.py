"""Wire contract of the billing service (meters per allocation)."""
from __future__ import annotations

import uuid
from datetime import datetime

from shared.contract import Message, ServiceContract
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


CONTRACT = ServiceContract(
    service="billing",
    title="Tessera billing service",
    description="Starts and stops a usage meter per allocation.",
    messages=[
        Message("billing.start_meter", "billing.cmd.start_meter", StartMeter, "command", "Saga step: start metering the allocation."),
        Message("billing.stop_meter", "billing.cmd.stop_meter", StopMeter, "command", "Saga step or compensation: stop the allocation's meter (idempotent)."),
        Message("billing.meter_started", "billing.evt.meter_started", MeterStarted, "event", "The meter runs."),
        Message("billing.meter_start_failed", "billing.evt.meter_start_failed", MeterStartFailed, "event", "The meter could not be started."),
        Message("billing.meter_stopped", "billing.evt.meter_stopped", MeterStopped, "event", "The meter is stopped; GPU-seconds recorded."),
    ],
    receives=["billing.start_meter", "billing.stop_meter"],
)
