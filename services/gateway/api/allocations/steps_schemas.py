"""HTTP models of an allocation's saga timeline (GET /v1/allocations/{id}/steps), as the saga service answers
``saga.read_steps``."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import Field

from ...http.schema_base import Out


class StepTimingOut(Out):
    step: str = Field(description="The step's name, as the saga's definition names it.")
    phase: Literal["invoke", "compensate"] = Field(description="compensate: the step's undo.")
    status: str = Field(description="invoked, waiting, retrying, succeeded, failed, timed_out; an undo: armed "
                                    "(never needed), disarmed (its step failed: nothing to undo), compensating, "
                                    "compensated, failed. A skipped step: succeeded with attempt 0.")
    attempt: int = Field(description="How many times its command was sent (0: never, it was skipped).")
    started_at: datetime | None = Field(description="When its command was first sent (resends keep it).")
    finished_at: datetime | None = Field(description="When it succeeded, failed, timed out or was compensated.")
    duration_s: float | None = Field(description="finished_at - started_at in seconds; null while it runs.")
    error: str | None = Field(description="Why it failed, timed out or is being resent.")


class SagaStepsOut(Out):
    saga_id: uuid.UUID
    kind: Literal["allocate", "release", "reschedule"]
    state: Literal["running", "compensating", "completed", "failed"]
    started_at: datetime
    finished_at: datetime | None = Field(description="When it completed or failed; null while it runs.")
    steps: list[StepTimingOut] = Field(description="In the order the saga runs them, each undo right after its "
                                                   "step.")


class AllocationStepsOut(Out):
    """Every saga of an allocation (allocate, release, each move), oldest first, with when each step ran."""

    items: list[SagaStepsOut]
