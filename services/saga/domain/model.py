"""Saga state, the inputs the state machine accepts and what it returns (pure; no I/O): the actions the
coordinator carries out, and the log of step changes.

State mirrors the two tables: one ``Saga`` row, and one ``StepRecord`` per
(step, phase), phase being "invoke" (the step itself) or "compensate" (its undo).

Step record statuses:
- invoke:     invoked → succeeded | failed | timed_out; release steps also retrying → invoked (resent);
              a step with a progress reply also invoked → waiting (queued, longer deadline) → succeeded | failed | timed_out
- compensate: armed (set when the step is invoked) → compensating → compensated,
              or → retrying → compensating (resent) ... → failed (gave up); disarmed when the step
              itself failed (the participant did nothing, so there is nothing to undo)
A record is *awaiting* (has a deadline) while invoked, waiting, compensating or retrying.

Each record also says when it ran (``timed``): started when its command is first sent, finished when it
reaches an end; the saga says when it completed or failed (``Saga.finished_at``).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple

INVOKE, COMPENSATE = "invoke", "compensate"
Phase = Literal["invoke", "compensate"]
AWAITING = frozenset({"invoked", "waiting", "compensating", "retrying"})
OPEN = frozenset({"running", "compensating"})           # saga statuses that still act
STARTS = frozenset({"invoked", "compensating"})          # a command (or undo command) is sent with these
ENDS = frozenset({"succeeded", "failed", "timed_out", "compensated"})
SagaStatus = Literal["running", "compensating", "completed", "failed"]


@dataclass(frozen=True)
class Policy:
    """Timeouts, attempts and backoff, and how many allocate sagas one tenant may have in flight (the rest
    wait in the tenant's line, ``domain.lines``). Raises ValueError for values that make no sense."""

    step_timeout_s: float = 30.0
    compensation_timeout_s: float = 10.0
    compensation_attempts: int = 5
    release_attempts: int = 8
    backoff_s: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)
    queue_timeout_s: float = 86_400.0   # how long a step that reported "queued" may wait for capacity
    # (step name, seconds): steps that take longer than a message round trip by nature. provision_node boots a
    # VM (a cloud image's first boot with cloud-init takes a minute or more) or a bare-metal server. fence_node
    # waits for a BMC's power-off and its read-back (the agent's own bound, 60 s, then a best-effort eject, 60 s):
    # longer than both, so the agent's reason, quoting the BMC, normally comes before the saga gives up.
    step_timeouts: tuple[tuple[str, float], ...] = (("provision_node", 600.0), ("wipe_slots", 600.0),
                                                    ("fence_node", 180.0))
    tenant_inflight: int = 8   # allocate sagas of one tenant running or compensating at once

    def __post_init__(self) -> None:
        if self.step_timeout_s <= 0 or self.compensation_timeout_s <= 0 or self.queue_timeout_s <= 0:
            raise ValueError("saga timeouts must be positive")
        if any(seconds <= 0 for _, seconds in self.step_timeouts):
            raise ValueError("saga step timeouts must be positive")
        if self.tenant_inflight < 1:
            raise ValueError("a tenant needs room for at least one allocate saga in flight")
        if self.compensation_attempts < 1 or self.release_attempts < 1:
            raise ValueError("saga attempts must be at least 1")
        if not self.backoff_s or any(b < 0 for b in self.backoff_s):
            raise ValueError("saga backoff needs at least one non-negative delay")

    def backoff(self, attempt: int) -> timedelta:
        """Wait after the ``attempt``-th unanswered attempt (1-based); the last delay repeats."""
        return timedelta(seconds=self.backoff_s[min(attempt, len(self.backoff_s)) - 1])

    def step_timeout_of(self, step: str) -> float:
        """Seconds the step ``step`` may take (its own timeout, else the default)."""
        return dict(self.step_timeouts).get(step, self.step_timeout_s)

    def step_timeout(self, step: str) -> timedelta:
        return timedelta(seconds=self.step_timeout_of(step))

    @property
    def queue_timeout(self) -> timedelta:
        return timedelta(seconds=self.queue_timeout_s)

    @property
    def compensation_timeout(self) -> timedelta:
        return timedelta(seconds=self.compensation_timeout_s)


@dataclass
class StepRecord:
    status: str
    attempt: int = 0
    deadline: datetime | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def awaiting(self) -> bool:
        return self.status in AWAITING and self.deadline is not None


def timed(old: StepRecord | None, status: str, now: datetime) -> tuple[datetime | None, datetime | None]:
    """(started_at, finished_at) of a record moving from ``old`` to ``status`` at ``now``.

    Started when its command is sent (``STARTS``), and only the first time: a resend keeps the first start
    (``attempt`` counts the sends). Finished on an end (``ENDS``; a step skipped, which goes straight to
    succeeded, starts and finishes at once); not finished while it waits or retries, and a record sent again
    is not finished any more. Armed and disarmed records never ran: no times."""
    started = old.started_at if old is not None else None
    if status in STARTS:
        return started or now, None
    if status in ENDS:
        return started or now, now
    return started, None


@dataclass
class Saga:
    id: uuid.UUID
    kind: Literal["allocate", "release", "reschedule"]
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    input: dict[str, Any]
    status: SagaStatus = "running"
    current_step: str | None = None
    failed_step: str | None = None
    reason: str | None = None
    steps: dict[tuple[str, str], StepRecord] = field(default_factory=dict)
    finished_at: datetime | None = None   # when it completed or failed

    def record(self, step: str, phase: str = INVOKE) -> StepRecord | None:
        return self.steps.get((step, phase))


# --- inputs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Start:
    now: datetime


@dataclass(frozen=True)
class Reply:
    """A participant's reply: its message type, the echoed step and key, and its other fields."""

    type: str
    step: str
    idempotency_key: str
    data: dict[str, Any]
    now: datetime


@dataclass(frozen=True)
class Expired:
    """The deadline of (step, phase) has passed."""

    step: str
    phase: Phase
    now: datetime


Input = Start | Reply | Expired


# --- actions --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    """Send a command (to a participant or to the allocation service)."""

    type: str
    data: dict[str, Any]
    subject_params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    """Emit one of the saga's own events."""

    type: str
    data: dict[str, Any]


Action = Command | Event


@dataclass(frozen=True)
class StepChange:
    """One step record moving to a new status. The machine logs every one; it publishes as
    ``saga.step_changed`` only those no other message states (``machine.restated``)."""

    step: str
    phase: Phase
    status: str
    attempt: int
    detail: str | None = None


class Outcome(NamedTuple):
    """What one input did: the new saga, the actions to carry out, and every step change in order."""

    saga: Saga
    actions: list[Action]
    changes: list[StepChange]
