"""The saga-participant side of a step: at most one effect per idempotency key, tombstones, later answers.

Every outcome is recorded in ``step_outcomes`` under the command's idempotency key, in the transaction of
the effect:
- ``done`` / ``failed``: the step's answer; a repeated command (the coordinator retrying, JetStream
  redelivering) gets the recorded reply again;
- ``deferred``: the participant accepted the step and answers later (the scheduler queues a reservation
  that does not fit yet): ``defer`` records it and sends the step's progress reply; ``finish``, when the
  answer is known, records the final outcome and sends the final reply;
- ``compensated``: the tombstone ``undo`` leaves when it compensates a key, so that a late invoke of that
  key (it was still in flight when the saga timed it out) has no effect and answers failure.

``invoke`` and ``undo`` do all of it for a step whose action answers at once. A participant with a flow of
its own uses the pieces: ``recorded`` (lock the key, read its outcome), ``answer`` (the reply an outcome
calls for), ``defer`` and ``finish``. The replies are the messages of the step's declaration
(``shared.steps.Step``).

Fault injection for the ``sim`` platform: when the service runs with
TESSERA_SIM_FAULTS=1, the label ``sim.tessera.io/fault: "<step>=<mode>"`` on an
allocation makes the participant of that step ``fail`` (reply failure) or
``timeout`` (never reply). Without that setting the label means nothing.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import asyncpg
import structlog

from .refusals import permanent, refusal_reason, text_safe
from .steps import Step
from .unit_of_work import RunUnderSavepoint, UnitOfWork
from .wire import StepCommand, UndoCommand

log = structlog.get_logger()

FAULT_LABEL = "sim.tessera.io/fault"
COMPENSATED = "compensated before it ran (the saga had given up on this step)"
_REPLY_FIELDS = ("saga_id", "step", "idempotency_key", "allocation_id")

Command = StepCommand | Mapping[str, Any]    # as received, or as a participant stored it to answer later


class StepRejected(Exception):
    """A business failure of the step (no capacity, quota): reply failure, effect nothing."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Outcome:
    status: Literal["done", "failed", "deferred", "compensated"]
    result: dict[str, Any] = field(default_factory=dict)   # the reply's own fields (done, failed, deferred)


def injected_fault(cmd: StepCommand, enabled: bool) -> str | None:
    if not enabled:
        return None
    for spec in cmd.labels.get(FAULT_LABEL, "").split(","):
        step, _, mode = spec.partition("=")
        if step.strip() == cmd.step and mode.strip() in ("fail", "timeout"):
            return mode.strip()
    return None


def _field(cmd: Command, name: str) -> Any:
    return cmd[name] if isinstance(cmd, Mapping) else getattr(cmd, name)


def _reply_fields(cmd: Command) -> dict:
    return {k: _field(cmd, k) for k in _REPLY_FIELDS}


async def _lock_key(conn: asyncpg.Connection, key: str) -> None:
    """Serialise an invoke and the compensation of the same key (held until the transaction ends):
    a row lock cannot, since before the first outcome there is no row to lock."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key)


async def _record(ctx: UnitOfWork, key: str, status: str, result: dict) -> None:
    """Record ``key``'s outcome in the unit of work's transaction (written with its outbox rows when it defers)."""
    await ctx.record_outcome(key, status, json.dumps(result, default=str))


# --- the pieces ------------------------------------------------------------------------------------------------
async def recorded(ctx: UnitOfWork, key: str) -> Outcome | None:
    """Lock ``key`` until the transaction ends and return its recorded outcome (None: never handled), in one
    round trip (the kit's function ``step_outcome_locked``). An outcome this transaction recorded and has not
    written yet (``UnitOfWork.record_outcome``), or one its batch read ahead (``Writes.read_ahead``), is answered
    from memory: the transaction holds the key's lock."""
    writes = ctx.writes
    kept = writes.outcome(key)
    if kept is None and key in writes.known:   # its batch locked and read it already
        kept = writes.known[key]
        if kept is None:
            return None
    if kept is not None:
        return Outcome(kept[0], json.loads(kept[1]))
    row = await ctx.conn.fetchrow("SELECT status, result FROM step_outcome_locked($1)", key)
    return Outcome(row["status"], json.loads(row["result"])) if row else None


async def answer(ctx: UnitOfWork, step: Step, cmd: Command, outcome: Outcome, *, correlation_id: str | None = None,
                 tenant_id: uuid.UUID | None = None, subject_params: dict[str, str] | None = None,
                 compensated: Mapping[str, Any] | None = None) -> None:
    """Send the reply ``outcome`` calls for: done → ``ok``; failed → ``failed``; deferred → ``progress``
    (each with the outcome's fields); compensated → ``failed`` with reason COMPENSATED and the
    ``compensated`` fields. The envelope's correlation id and tenant are the causing message's unless
    given (an answer sent later names the original command's)."""
    if outcome.status == "compensated":
        reply, fields = step.failed, {"reason": COMPENSATED, **(compensated or {})}
    else:
        reply = {"done": step.ok, "failed": step.failed, "deferred": step.progress}[outcome.status]
        fields = outcome.result
    if reply is None:
        raise ValueError(f"the step declares no reply for a {outcome.status} outcome")
    await ctx.emit(reply.type, reply.model(**_reply_fields(cmd), **fields), correlation_id=correlation_id,
                   tenant_id=tenant_id, subject_params=subject_params)


async def finish(ctx: UnitOfWork, step: Step, cmd: Command, status: Literal["done", "failed"], result: dict,
                 **reply: Any) -> None:
    """Record the step's final outcome under the command's key and send its reply: at once, or later to
    complete a deferred step (``reply``: see ``answer``)."""
    await _record(ctx, _field(cmd, "idempotency_key"), status, result)
    await answer(ctx, step, cmd, Outcome(status, result), **reply)


async def defer(ctx: UnitOfWork, step: Step, cmd: Command, progress: dict, **reply: Any) -> None:
    """Record that the step is accepted and answered later, and send its progress reply. Until ``finish``
    the key's outcome stays deferred."""
    await _record(ctx, _field(cmd, "idempotency_key"), "deferred", progress)
    await answer(ctx, step, cmd, Outcome("deferred", progress), **reply)


# --- a whole step ----------------------------------------------------------------------------------------------
def over(repository: Callable[[asyncpg.Connection], Any],
         step: Callable[[Any, Any], Awaitable[dict]]) -> Callable[[asyncpg.Connection, Any], Awaitable[dict]]:
    """An action for ``invoke``/``undo`` that runs ``step(repo, cmd)`` on the repository ``repository`` builds on
    the participant's connection (the step's logic depends on a port, not on asyncpg: unit tests pass a fake)."""
    async def action(conn: asyncpg.Connection, cmd: Any) -> dict:
        return await step(repository(conn), cmd)
    return action


async def invoke(ctx: UnitOfWork, cmd: StepCommand, action: Callable[[asyncpg.Connection, StepCommand], Awaitable[dict]],
                 *, step: Step, sim_faults: bool = False, subject_params: dict[str, str] | None = None,
                 optimistic: bool = False) -> None:
    """Run ``action`` (returns the reply's extra fields, or raises StepRejected) once per idempotency key;
    a repeat gets the recorded reply (``step``'s ok or failed). An error no retry can fix raised by the
    action (``shared.refusals.permanent``: invalid data, an unknown reference, PermanentError) is the step's
    failure too, with its reason: the saga compensates at once instead of waiting out its deadline.

    The action runs under a savepoint, so that a rejected step leaves nothing behind; ``optimistic`` (an action
    whose work is all in the database) saves that savepoint's two round trips in the consumer kit's first run of
    a batch (``UnitOfWork.optimistic``): a rejection there rolls the batch back (``RunUnderSavepoint``) and the kit
    runs it again at once, each handler under a savepoint, where the action runs under its own as always."""
    conn = ctx.conn
    outcome = await recorded(ctx, cmd.idempotency_key)
    if outcome is None:
        fault = injected_fault(cmd, sim_faults)
        if fault == "timeout":
            log.warning("step.fault_injected", step=cmd.step, mode=fault)
            return
        try:
            if fault == "fail":
                raise StepRejected(f"injected fault at {cmd.step}")
            if optimistic and ctx.optimistic:
                outcome = await _without_savepoint(conn, cmd, action)
            else:
                async with conn.transaction():   # a savepoint: a rejected step leaves nothing behind
                    outcome = Outcome("done", await action(conn, cmd))
        except StepRejected as rej:
            outcome = Outcome("failed", {"reason": text_safe(rej.reason, 4000)})   # storable even if it quotes a NUL
        except Exception as exc:
            if not permanent(exc):
                raise                            # may succeed on a retry
            log.warning("step.refused", step=cmd.step, idempotency_key=cmd.idempotency_key, error=repr(exc)[:300])
            outcome = Outcome("failed", {"reason": refusal_reason(exc)})
        await _record(ctx, cmd.idempotency_key, outcome.status, outcome.result)
    await answer(ctx, step, cmd, outcome, subject_params=subject_params)


async def _without_savepoint(conn: asyncpg.Connection, cmd: StepCommand,
                             action: Callable[[asyncpg.Connection, StepCommand], Awaitable[dict]]) -> Outcome:
    """The action, in a transaction the kit rolls back whole and runs again should it be rejected."""
    try:
        return Outcome("done", await action(conn, cmd))
    except Exception as exc:
        if isinstance(exc, StepRejected) or permanent(exc):
            raise RunUnderSavepoint(f"{cmd.step} was refused: what it wrote must be undone alone") from exc
        raise


async def undo(ctx: UnitOfWork, cmd: UndoCommand, action: Callable[[asyncpg.Connection, UndoCommand], Awaitable[dict]],
               *, step: Step, subject_params: dict[str, str] | None = None) -> None:
    """Run an idempotent undo (safe when the step never happened); leave the tombstone of the compensated
    key. Replies ``step``'s undone with the action's fields."""
    reply = step.undone
    if cmd.compensates and cmd.compensates not in ctx.writes.known:   # else its batch locked it already
        await _lock_key(ctx.conn, cmd.compensates)
    extra = await action(ctx.conn, cmd)
    if cmd.compensates:
        await _record(ctx, cmd.compensates, "compensated", {})
    await ctx.emit(reply.type, reply.model(**_reply_fields(cmd), **extra), subject_params=subject_params)
