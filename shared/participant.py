"""The saga-participant side of a step: at most one effect per idempotency key, and tombstones.

``invoke`` runs a step's action once per key and records its outcome in
``step_outcomes`` in the same transaction as the effect; a repeated command (the
coordinator retrying, or JetStream redelivering) gets the recorded reply again.
``undo`` runs an idempotent undo and, when it is a compensation, marks the
compensated key so that a late invoke of that key (it was still in flight when
the saga timed it out) has no effect and answers failure.

Fault injection for the ``sim`` platform: when the service runs with
TESSERA_SIM_FAULTS=1, the label ``sim.tessera.io/fault: "<step>=<mode>"`` on an
allocation makes the participant of that step ``fail`` (reply failure) or
``timeout`` (never reply). Without that setting the label means nothing.
"""
from __future__ import annotations

import json
from typing import Awaitable, Callable

import asyncpg
import structlog
from pydantic import BaseModel

from .unit_of_work import UnitOfWork
from .wire import StepCommand, UndoCommand

log = structlog.get_logger()

FAULT_LABEL = "sim.tessera.io/fault"


class StepRejected(Exception):
    """A business failure of the step (no capacity, quota): reply failure, effect nothing."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def injected_fault(cmd: StepCommand, enabled: bool) -> str | None:
    if not enabled:
        return None
    for spec in cmd.labels.get(FAULT_LABEL, "").split(","):
        step, _, mode = spec.partition("=")
        if step.strip() == cmd.step and mode.strip() in ("fail", "timeout"):
            return mode.strip()
    return None


def _reply_fields(cmd: StepCommand) -> dict:
    return {"saga_id": cmd.saga_id, "step": cmd.step, "idempotency_key": cmd.idempotency_key,
            "allocation_id": cmd.allocation_id}


async def _lock_key(conn: asyncpg.Connection, key: str) -> None:
    """Serialise an invoke and the compensation of the same key (held until the transaction ends):
    a row lock cannot, since before the first outcome there is no row to lock."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key)


async def _record(conn: asyncpg.Connection, key: str, status: str, result: dict) -> None:
    await conn.execute(
        "INSERT INTO step_outcomes (idempotency_key, status, result) VALUES ($1, $2, $3::jsonb) "
        "ON CONFLICT (idempotency_key) DO UPDATE SET status = EXCLUDED.status, result = EXCLUDED.result, updated_at = now()",
        key, status, json.dumps(result))


async def invoke(ctx: UnitOfWork, cmd: StepCommand, action: Callable[[asyncpg.Connection, StepCommand], Awaitable[dict]],
                 *, succeeded: str, failed: str, reply_model: type[BaseModel], failure_model: type[BaseModel],
                 sim_faults: bool = False, subject_params: dict[str, str] | None = None) -> None:
    """Run ``action`` (returns the reply's extra fields, or raises StepRejected) once per idempotency key."""
    conn = ctx.conn
    await _lock_key(conn, cmd.idempotency_key)
    row = await conn.fetchrow("SELECT status, result FROM step_outcomes WHERE idempotency_key=$1 FOR UPDATE", cmd.idempotency_key)
    base = _reply_fields(cmd)
    if row is None:
        fault = injected_fault(cmd, sim_faults)
        if fault == "timeout":
            log.warning("step.fault_injected", step=cmd.step, mode=fault)
            return
        try:
            if fault == "fail":
                raise StepRejected(f"injected fault at {cmd.step}")
            async with conn.transaction():   # a savepoint: a rejected step leaves nothing behind
                extra = await action(conn, cmd)
            await _record(conn, cmd.idempotency_key, "done", json.loads(json.dumps(extra, default=str)))
            status, result = "done", extra
        except StepRejected as rej:
            await _record(conn, cmd.idempotency_key, "failed", {"reason": rej.reason})
            status, result = "failed", {"reason": rej.reason}
    else:
        status, result = row["status"], json.loads(row["result"])
        if status == "compensated":
            result = {"reason": "compensated before it ran (the saga had given up on this step)"}
    if status == "done":
        await ctx.emit(succeeded, reply_model(**base, **result), subject_params=subject_params)
    else:
        await ctx.emit(failed, failure_model(**base, reason=result["reason"]), subject_params=subject_params)


async def undo(ctx: UnitOfWork, cmd: UndoCommand, action: Callable[[asyncpg.Connection, UndoCommand], Awaitable[dict]],
               *, undone: str, reply_model: type[BaseModel], subject_params: dict[str, str] | None = None) -> None:
    """Run an idempotent undo (safe when the step never happened); mark the compensated key."""
    if cmd.compensates:
        await _lock_key(ctx.conn, cmd.compensates)
    extra = await action(ctx.conn, cmd)
    if cmd.compensates:
        await _record(ctx.conn, cmd.compensates, "compensated", {})
    await ctx.emit(undone, reply_model(**_reply_fields(cmd), **extra), subject_params=subject_params)
