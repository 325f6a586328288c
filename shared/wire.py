"""Wire building blocks shared by every saga participant's contract.

Every saga command carries the saga id, the step name and the idempotency key
``"<saga id>:<step>"``; every reply echoes them. An undo command (a compensation
or a release step) names in ``compensates`` the key of the step it undoes, if any.
"""
from __future__ import annotations

import uuid

from pydantic import BaseModel, ConfigDict, Field


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StepCommand(Wire):
    saga_id: uuid.UUID
    step: str
    idempotency_key: str = Field(description="'<saga id>:<step>'; a participant acts at most once per key.")
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    labels: dict[str, str] = Field(default_factory=dict)


class UndoCommand(StepCommand):
    compensates: str | None = Field(default=None, description="Idempotency key of the step this undoes, if a compensation.")


class StepReply(Wire):
    saga_id: uuid.UUID
    step: str
    idempotency_key: str
    allocation_id: uuid.UUID


class StepFailure(StepReply):
    reason: str


class StepUndone(StepReply):
    pass


def step_key(saga_id: uuid.UUID | str, step: str) -> str:
    return f"{saga_id}:{step}"
