"""Wire contract of the scheduler service (nodes, GPU slots, placement and reservation)."""
from __future__ import annotations

import uuid

from pydantic import Field

from shared.contract import Message, ServiceContract
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand, Wire


class RegisterNode(Wire):
    node_id: uuid.UUID
    name: str = Field(min_length=1, max_length=63)
    gpu_model: str = Field(min_length=1, max_length=64)
    gpu_count: int = Field(ge=1, le=16)
    labels: dict[str, str] = Field(default_factory=dict)


class NodeRegistered(Wire):
    node_id: uuid.UUID
    name: str
    gpu_model: str
    gpu_count: int


class ReserveSlots(StepCommand):
    shape: str
    gpu_count: int = Field(ge=1, le=16)


class SlotsReserved(StepReply):
    node_id: uuid.UUID
    slots: list[int]
    gpu_model: str


class SlotReservationFailed(StepFailure):
    pass


class ReleaseSlots(UndoCommand):
    pass


class SlotsReleased(StepUndone):
    slots_freed: int = 0


CONTRACT = ServiceContract(
    service="scheduler",
    title="Tessera scheduler service",
    description="Owns nodes and GPU slots; places and reserves allocations (first fit).",
    messages=[
        Message("scheduler.register_node", "scheduler.cmd.register_node", RegisterNode, "command", "A provider admin registers a node and its GPU slots."),
        Message("scheduler.reserve_slots", "scheduler.cmd.reserve_slots", ReserveSlots, "command", "Saga step: reserve GPU slots for an allocation."),
        Message("scheduler.release_slots", "scheduler.cmd.release_slots", ReleaseSlots, "command", "Saga step or compensation: free the allocation's slots (idempotent)."),
        Message("scheduler.node_registered", "scheduler.evt.node_registered", NodeRegistered, "event", "A node and its slots exist."),
        Message("scheduler.slots_reserved", "scheduler.evt.slots_reserved", SlotsReserved, "event", "Slots were reserved for the allocation."),
        Message("scheduler.slot_reservation_failed", "scheduler.evt.slot_reservation_failed", SlotReservationFailed, "event", "No slots could be reserved."),
        Message("scheduler.slots_released", "scheduler.evt.slots_released", SlotsReleased, "event", "The allocation holds no slots."),
    ],
    receives=["scheduler.register_node", "scheduler.reserve_slots", "scheduler.release_slots"],
)
