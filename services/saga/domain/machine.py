"""The saga state machine: (saga, input) -> (new saga, actions, step changes). Pure and deterministic.

``handle`` never mutates its argument and never performs I/O; the coordinator
persists the returned state and writes the returned actions to the outbox in one
transaction. Inputs that do not apply (a duplicate reply, a reply for a step not
awaiting one, a deadline already met) change nothing and return no actions, so
every input may be delivered more than once.

Every step change is logged in the outcome, but only those no other message states are published as
``saga.step_changed`` (``restated``): the commands and replies on the bus already say the rest.
"""
from __future__ import annotations

import dataclasses
from datetime import datetime

from shared.wire import step_key

from .definitions import DEFINITIONS, Notice, SagaDefinition, SagaStep, context
from .model import (
    COMPENSATE,
    INVOKE,
    OPEN,
    Action,
    Command,
    Event,
    Expired,
    Input,
    Outcome,
    Policy,
    Reply,
    Saga,
    Start,
    StepChange,
    StepRecord,
    timed,
)


def compensation_key(saga_id, step: str) -> str:
    return step_key(saga_id, "compensate:" + step)


# Step statuses that only a transition sending the step's command (or undo command) sets: that command says it.
SAID_BY_COMMAND = frozenset({"invoked", "compensating"})
# Step statuses a participant's reply sets (waiting: scheduler.reservation_queued; failed: a refusal): when
# that reply for that step is the input, the reply says it.
SAID_BY_REPLY = frozenset({"waiting", "succeeded", "failed", "compensated"})


def restated(change: StepChange, cause: Input) -> bool:
    """Whether another message on the bus already states ``change``; such a change is not published as
    ``saga.step_changed`` (it stays in ``Outcome.changes`` and in the saga's step records).

    Restated: "invoked" and "compensating" (the command or undo command sent with it), and "waiting",
    "succeeded", "failed" and "compensated" caused by that step's own reply. Published, as only the
    coordinator knows them: "timed_out", "retrying" (a resend scheduled), "failed" when the coordinator
    gives up (attempts exhausted, no reply), and a step skipped ("succeeded", detail "skipped: ...": no
    command, no reply) — unless skipping is the step's common case (``SagaStep.quiet_skip``: a VM slice has no
    switch port to move), which is no news to anyone (the machine passes ``quiet``).

    Why: throughput. Each published message costs an outbox row, a relay publish and a consumer
    transaction downstream (the gateway's projection); restating the commands and replies was 12 of the
    ~30 messages of a successful allocation, and told no subscriber anything the bus did not.
    """
    if change.status in SAID_BY_COMMAND:
        return True
    return isinstance(cause, Reply) and cause.step == change.step and change.status in SAID_BY_REPLY


def handle(saga: Saga, message: Input, policy: Policy) -> Outcome:
    """Apply one input. Idempotent: an input that does not apply yields (unchanged saga, [], [])."""
    t = _Transition(saga, policy, message)
    if isinstance(message, Start):
        t.start()
    elif isinstance(message, Reply):
        t.reply(message)
    elif isinstance(message, Expired):
        t.expire(message.step, message.phase)
    else:
        raise TypeError(f"not a saga input: {message!r}")
    return Outcome(t.saga, t.actions, t.changes)


def expired(saga: Saga, now: datetime) -> list[Expired]:
    """The (step, phase) records of an open saga whose deadline has passed at ``now``."""
    if saga.status not in OPEN:
        return []
    return [Expired(step, phase, now) for (step, phase), rec in saga.steps.items()
            if rec.awaiting and rec.deadline <= now]


class _Transition:
    def __init__(self, saga: Saga, policy: Policy, cause: Input):
        # The machine never changes a step record or the input in place (it replaces records), so a copy of
        # the saga with its own step table leaves the argument untouched (a deep copy cost a fifth of a reply).
        self.saga = dataclasses.replace(saga, steps=dict(saga.steps))
        self.definition: SagaDefinition = DEFINITIONS[saga.kind]
        self.policy, self.cause, self.now = policy, cause, cause.now
        self.actions: list[Action] = []
        self.changes: list[StepChange] = []

    # --- inputs -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self.saga.steps:          # already started: a redelivered start does nothing
            return
        self._event("saga.started", steps=self.definition.names)
        self._invoke(self.definition.steps[0], attempt=1)

    def reply(self, r: Reply) -> None:
        step = self.definition.step(r.step)
        if step is None or self.saga.status not in OPEN:
            return
        if r.type in (step.ok, step.fail) and r.idempotency_key == step_key(self.saga.id, step.name):
            self._invoke_replied(step, r)
        elif step.progress and r.type == step.progress and r.idempotency_key == step_key(self.saga.id, step.name):
            self._invoke_progressed(step, r)
        elif step.undone and r.type == step.undone and r.idempotency_key == compensation_key(self.saga.id, step.name):
            self._compensation_replied(step)

    def expire(self, step_name: str, phase: str) -> None:
        step, rec = self.definition.step(step_name), self.saga.record(step_name, phase)
        if step is None or rec is None or not rec.awaiting or rec.deadline > self.now or self.saga.status not in OPEN:
            return
        if phase == INVOKE:
            self._invoke_expired(step, rec)
        else:
            self._compensation_expired(step, rec)

    # --- forward ----------------------------------------------------------------------------------

    def _invoke(self, step: SagaStep, attempt: int) -> None:
        ctx = context(self.saga, self.definition)
        if not step.has_work(ctx):
            self._set(step.name, INVOKE, "succeeded", attempt=0, detail=f"skipped: no {step.needed}",
                      quiet=step.quiet_skip)
            return self._advance(step)
        if step.skip_if and ctx.get(step.skip_if):
            self._set(step.name, INVOKE, "succeeded", attempt=0, detail=f"skipped: {step.skip_if}")
            return self._advance(step)
        self.saga.current_step = step.name
        if step.compensate and self.saga.record(step.name, COMPENSATE) is None:
            self.saga.steps[(step.name, COMPENSATE)] = StepRecord("armed")   # armed before the command goes out
        data = {**self._base(step.name, step_key(self.saga.id, step.name)), **step.fields(ctx)}
        self._command(step.invoke, data, self._subject(step, ctx, data))
        self._set(step.name, INVOKE, "invoked", attempt=attempt, deadline=self.now + self.policy.step_timeout(step.name))

    def _invoke_progressed(self, step: SagaStep, r: Reply) -> None:
        """The participant accepted the step but cannot finish it yet (queued for capacity): wait longer."""
        rec = self.saga.record(step.name)
        if rec is None or rec.status not in ("invoked", "retrying"):
            return   # duplicate (already waiting), stale, or after the final reply
        detail = str(r.data.get("reason") or "waiting")
        self._set(step.name, INVOKE, "waiting", attempt=rec.attempt, deadline=self.now + self.policy.queue_timeout,
                  detail=detail)

    def _invoke_replied(self, step: SagaStep, r: Reply) -> None:
        rec = self.saga.record(step.name)
        if rec is None or rec.status not in ("invoked", "retrying", "waiting"):
            return   # duplicate, stale, or late (the step already timed out and is being compensated)
        if r.type == step.ok:
            self._set(step.name, INVOKE, "succeeded", attempt=rec.attempt, result=r.data)
            return self._advance(step)
        reason = str(r.data.get("reason") or f"{step.name} failed")
        self._set(step.name, INVOKE, "failed", attempt=rec.attempt, error=reason, detail=reason)
        if self.saga.record(step.name, COMPENSATE) is not None:
            self.saga.steps[(step.name, COMPENSATE)] = StepRecord("disarmed")   # a refused step did nothing
        self._begin_compensation(step, reason)

    def _invoke_expired(self, step: SagaStep, rec: StepRecord) -> None:
        if rec.status == "retrying":
            return self._invoke(step, rec.attempt + 1)
        reason = (f"still queued after {self.policy.queue_timeout_s:g}s" if rec.status == "waiting"
                  else f"timed out after {self.policy.step_timeout_of(step.name):g}s")
        if self.definition.recovery == "compensate":
            # The outcome is unknown: the step is compensated too (first), its undo being safe either way.
            self._set(step.name, INVOKE, "timed_out", attempt=rec.attempt, error=reason, detail=reason)
            return self._begin_compensation(step, reason)
        if self._retry_later(step, INVOKE, rec, reason, self.policy.release_attempts):
            return
        self._finish_failed(step.name, f"{step.name} unconfirmed after {rec.attempt} attempts ({reason} each)")

    def _advance(self, step: SagaStep) -> None:
        nxt = self.definition.after(step.name)
        if nxt is not None:
            return self._invoke(nxt, attempt=1)
        self.saga.status, self.saga.current_step, self.saga.finished_at = "completed", None, self.now
        self._event("saga.completed")

    # --- compensation -----------------------------------------------------------------------------

    def _begin_compensation(self, step: SagaStep, reason: str) -> None:
        self.saga.status, self.saga.failed_step, self.saga.reason = "compensating", step.name, reason
        self._next_compensation()

    def _next_compensation(self) -> None:
        """Undo the latest step that ran (or may have run) and is not undone yet; finish when none is left."""
        for step in reversed(self.definition.steps):
            undo, did = self.saga.record(step.name, COMPENSATE), self.saga.record(step.name)
            if undo and undo.status == "armed" and did and did.status in ("succeeded", "timed_out"):
                return self._compensate(step, attempt=1)
        self._finish_failed(self.saga.failed_step or "", self.saga.reason or "")

    def _compensate(self, step: SagaStep, attempt: int) -> None:
        ctx = context(self.saga, self.definition)
        self.saga.current_step = step.name
        data = {**self._base(step.name, compensation_key(self.saga.id, step.name)),
                "compensates": step_key(self.saga.id, step.name), **step.undo_fields(ctx)}
        self._command(step.compensate, data, self._subject(step, ctx, data))
        self._set(step.name, COMPENSATE, "compensating", attempt=attempt,
                  deadline=self.now + self.policy.compensation_timeout)

    def _compensation_replied(self, step: SagaStep) -> None:
        rec = self.saga.record(step.name, COMPENSATE)
        if rec is None or rec.status not in ("compensating", "retrying"):
            return   # duplicate or stale
        self._set(step.name, COMPENSATE, "compensated", attempt=rec.attempt)
        self._next_compensation()

    def _compensation_expired(self, step: SagaStep, rec: StepRecord) -> None:
        if rec.status == "retrying":
            return self._compensate(step, rec.attempt + 1)
        reason = f"no reply within {self.policy.compensation_timeout_s:g}s"
        if self._retry_later(step, COMPENSATE, rec, reason, self.policy.compensation_attempts):
            return
        self._next_compensation()   # an earlier step's undo must not wait on this one

    # --- endings and helpers ----------------------------------------------------------------------

    def _retry_later(self, step: SagaStep, phase: str, rec: StepRecord, reason: str, attempts: int) -> bool:
        """An unanswered command: schedule its resend after backoff (True), or, with no attempt left,
        record the failure and tell operators (False)."""
        if rec.attempt < attempts:
            wait = self.policy.backoff(rec.attempt)
            self._set(step.name, phase, "retrying", attempt=rec.attempt, deadline=self.now + wait, error=reason,
                      detail=f"{reason}; resend in {wait.total_seconds():g}s")
            return True
        self._set(step.name, phase, "failed", attempt=rec.attempt, error=reason, detail=reason)
        self._give_up(step, rec.attempt, reason)
        return False

    def _give_up(self, step: SagaStep, attempts: int, reason: str) -> None:
        self._event("saga.compensation_failed", step=step.name, attempts=attempts,
                    reason=f"{reason}, {attempts} attempts")

    def _finish_failed(self, failed_step: str, reason: str) -> None:
        s = self.saga
        s.status, s.current_step, s.failed_step, s.reason = "failed", None, failed_step, reason
        s.finished_at = self.now
        self._notify(self.definition.on_failure, failed_step=failed_step, reason=reason)
        undone = [st.name for st in reversed(self.definition.steps)
                  if (r := s.record(st.name, COMPENSATE)) is not None and r.status == "compensated"]
        self._event("saga.failed", failed_step=failed_step, reason=reason, compensated=undone)

    def _set(self, step: str, phase: str, status: str, *, attempt: int, deadline: datetime | None = None,
             result: dict | None = None, error: str | None = None, detail: str | None = None,
             quiet: bool = False) -> None:
        """Record the change; publish it unless another message states it (``restated``) or it is no news
        (``quiet``: a step skipped where it never applies)."""
        old = self.saga.record(step, phase)
        kept = result if result is not None else (old.result if old else None)
        self.saga.steps[(step, phase)] = StepRecord(status, attempt, deadline, kept, error,
                                                    *timed(old, status, self.now))
        change = StepChange(step, phase, status, attempt, detail)
        self.changes.append(change)
        if not quiet and not restated(change, self.cause):
            self._event("saga.step_changed", step=step, phase=phase, status=status, attempt=attempt, detail=detail)

    def _base(self, step: str, key: str) -> dict:
        s = self.saga
        return {"saga_id": s.id, "step": step, "idempotency_key": key, "allocation_id": s.allocation_id,
                "tenant_id": s.tenant_id, "labels": dict(s.input.get("labels") or {})}

    def _notify(self, notice: Notice | None, **facts) -> None:
        if notice is not None:
            s = self.saga
            self._command(notice.type, notice.fields({"saga_id": s.id, "allocation_id": s.allocation_id,
                                                      "tenant_id": s.tenant_id, **facts}))

    @staticmethod
    def _subject(step: SagaStep, ctx, data: dict) -> dict[str, str]:
        """The command's subject parameters: its own field of that name when it has one (so the subject and the
        node the command names never differ), else the context value."""
        return {p: str(data[p] if data.get(p) is not None else ctx.get(p)) for p in step.subject}

    def _command(self, type_: str, data: dict, subject_params: dict[str, str] | None = None) -> None:
        self.actions.append(Command(type_, data, subject_params or {}))

    def _event(self, type_: str, **fields) -> None:
        s = self.saga
        self.actions.append(Event(type_, {"saga_id": s.id, "kind": s.kind, "allocation_id": s.allocation_id, **fields}))
