"""Sagas and their steps in the saga schema (asyncpg; the caller owns the transaction).

A saga is always read under its row lock (``SELECT ... FOR UPDATE``), so a reply
handler and the deadline loop (in this or another replica) never work on one saga
at the same time. The deadline loop claims with ``SKIP LOCKED`` and never waits.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import NamedTuple

import asyncpg

from shared.db import in_list
from shared.unit_of_work import one_statement

from ..domain.model import AWAITING, OPEN, Saga, StepRecord
from . import lines


async def create(conn: asyncpg.Connection, saga: Saga) -> datetime | None:
    """Insert a new saga and return the database's clock; None (and nothing written) when the allocation
    already has one of this kind (and attempt: a reschedule's ``input["attempt"]``)."""
    return await conn.fetchval(
        "INSERT INTO sagas (id, kind, allocation_id, tenant_id, status, input, attempt) "
        "VALUES ($1,$2,$3,$4,$5,$6::jsonb,$7) ON CONFLICT (allocation_id, kind, attempt) DO NOTHING "
        "RETURNING clock_timestamp()",
        saga.id, saga.kind, saga.allocation_id, saga.tenant_id, saga.status, json.dumps(saga.input),
        int(saga.input.get("attempt") or 0))


_STEPS = ("coalesce((SELECT json_agg(json_build_object('step', step, 'phase', phase, 'status', status, 'attempt', "
          "attempt, 'deadline', deadline, 'result', result, 'error', error, 'started_at', started_at, "
          "'finished_at', finished_at)) FROM saga_steps WHERE saga_id=$1), '[]')")


async def get(conn: asyncpg.Connection, saga_id: uuid.UUID) -> tuple[Saga, datetime] | None:
    """Load a saga with its steps, locked until the transaction ends (may block on its lock), and the
    database's clock read once the lock is held.

    One round trip when the saga did not change while this statement waited for its lock: the steps are
    read in the statement's snapshot, which is the locked state when the row version the snapshot sees
    is the one locked (every change of a saga's steps updates its row: ``save``). Otherwise (another
    transaction committed a change meanwhile) a second statement reads the steps and the clock, after the
    lock, so they see what the previous holder committed."""
    row = await conn.fetchrow(
        "SELECT s.*, s.xmin::text = (SELECT xmin::text FROM sagas WHERE id=$1) AS unchanged, "
        f"clock_timestamp() AS now, {_STEPS} AS steps FROM sagas s WHERE s.id=$1 FOR UPDATE OF s", saga_id)
    if row is None:
        return None
    now, steps = row["now"], row["steps"]
    if not row["unchanged"]:
        now, steps = await conn.fetchrow(f"SELECT clock_timestamp(), {_STEPS}", saga_id)
    saga = Saga(
        id=row["id"], kind=row["kind"], allocation_id=row["allocation_id"], tenant_id=row["tenant_id"],
        input=json.loads(row["input"]), status=row["status"], current_step=row["current_step"],
        failed_step=row["failed_step"], reason=row["reason"], finished_at=row["finished_at"],
        steps={(s["step"], s["phase"]): StepRecord(s["status"], s["attempt"], _instant(s["deadline"]), s["result"],
                                                   s["error"], _instant(s["started_at"]), _instant(s["finished_at"]))
               for s in json.loads(steps)},
    )
    return saga, now


def _instant(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


_SAVE = ("UPDATE sagas SET status={1}, current_step={2}, failed_step={3}, reason={4}, finished_at={5}, "
         "updated_at=now() WHERE id={0}",
         "INSERT INTO saga_steps (saga_id, step, phase, status, attempt, deadline, result, error, started_at, "
         "finished_at) "
         "SELECT {0}, * FROM unnest({6}::text[], {7}::text[], {8}::text[], {9}::int[], {10}::timestamptz[], "
         "{11}::jsonb[], {12}::text[], {13}::timestamptz[], {14}::timestamptz[]) ON CONFLICT (saga_id, step, phase) "
         "DO UPDATE SET status=EXCLUDED.status, attempt=EXCLUDED.attempt, deadline=EXCLUDED.deadline, "
         "result=EXCLUDED.result, error=EXCLUDED.error, started_at=EXCLUDED.started_at, "
         "finished_at=EXCLUDED.finished_at")


async def save(conn: asyncpg.Connection, before: Saga, after: Saga) -> None:
    """Write ``save_statement`` now."""
    _, parts, args = save_statement(before, after)
    await conn.execute(*one_statement([], {}, [(parts, args)]))


def save_statement(before: Saga, after: Saga) -> tuple[str, tuple[str, ...], list]:
    """The statement that writes the saga row and every step record that changed between ``before`` and
    ``after`` (with when each ran: ``model.timed``), as ``UnitOfWork.write_last`` takes it: (what it changes,
    its queries, their parameters). Its two queries change two tables: one statement."""
    changed = [(step, phase, r.status, r.attempt, r.deadline, json.dumps(r.result) if r.result is not None else None,
                r.error, r.started_at, r.finished_at)
               for (step, phase), r in after.steps.items() if before.steps.get((step, phase)) != r]
    columns = list(zip(*changed)) if changed else [()] * 9
    return saga_key(after.id), _SAVE, [after.id, after.status, after.current_step, after.failed_step, after.reason,
                                       after.finished_at, *[list(c) for c in columns]]


def saga_key(saga_id: uuid.UUID) -> str:
    """What ``save_statement`` changes, for ``UnitOfWork.write_last_now``."""
    return f"saga:{saga_id}"


# an open saga (``s``) with a step whose deadline passed
# (the states written in: every plan then reads the partial index sagas_open, only the open sagas)
_DUE = (f"s.status IN {in_list(OPEN)} AND EXISTS (SELECT 1 FROM saga_steps st WHERE st.saga_id = s.id "
        f"AND st.deadline <= clock_timestamp() AND st.status IN {in_list(AWAITING)})")


async def claim_due(conn: asyncpg.Connection, skip: list[uuid.UUID]) -> uuid.UUID | None:
    """Lock one open saga with a passed deadline that no one else holds (never blocks); None if none."""
    return await conn.fetchval(
        f"SELECT s.id FROM sagas s WHERE {_DUE} AND s.id <> ALL($1::uuid[]) "
        "ORDER BY s.updated_at LIMIT 1 FOR UPDATE OF s SKIP LOCKED", skip)


class Due(NamedTuple):
    """What the deadline loop finds to do: passed deadlines, lines with room and requests waiting (a missed
    hand-over), lines that moved without their tenant's lock."""

    deadlines: bool
    short_lines: bool
    moved_lines: bool


async def due(conn: asyncpg.Connection, bound: int) -> Due:
    """Whether the deadline loop has each of its kinds of work, in one statement and no transaction: nearly
    always it has none, and each kind's own pass costs a few round trips. Read without locks: what another
    replica takes meanwhile, its pass finds gone; what commits just after, the next pass finds."""
    row = await conn.fetchrow(
        f"SELECT EXISTS (SELECT 1 FROM sagas s WHERE {_DUE}) AS deadlines, "
        "EXISTS (SELECT 1 FROM (SELECT DISTINCT tenant_id FROM saga_waiting) w "
        f"WHERE {lines.SHORT.format(bound='$1')}) AS short_lines, "
        "EXISTS (SELECT 1 FROM saga_line_moves) AS moved_lines", bound)
    return Due(row["deadlines"], row["short_lines"], row["moved_lines"])


# the reservation the allocation holds: its latest move's (a reschedule running or completed: one that failed
# gave its slots back), else its allocate saga's; with, when that saga provisioned a bare-metal server, where the
# server is cabled
_HELD = ("SELECT st.result, p.result->'instance'->'switch_port' AS switch_port FROM saga_steps st "
         "JOIN sagas s ON s.id = st.saga_id LEFT JOIN saga_steps p ON p.saga_id = s.id "
         "AND p.step='provision_node' AND p.phase='invoke' AND p.status='succeeded' "
         "WHERE s.allocation_id=$1 AND (s.kind='allocate' OR (s.kind='reschedule' AND s.status IN ('running', "
         "'completed'))) AND st.step='reserve_slots' AND st.phase='invoke' AND st.status='succeeded' "
         "ORDER BY s.attempt DESC LIMIT 1")


def _json(raw):
    return json.loads(raw) if isinstance(raw, str) else raw


async def reservation(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> dict:
    """What the allocation holds (its allocate saga's reservation, or its latest move's): {node_id, slots,
    slot_details, and switch_port when that saga provisioned a bare-metal server} ({} when nothing)."""
    row = await conn.fetchrow(_HELD, allocation_id)
    result = (_json(row["result"]) if row else None) or {}
    held = {k: result[k] for k in ("node_id", "slots", "slot_details") if result.get(k) is not None}
    port = _json(row["switch_port"]) if row else None
    return {**held, "switch_port": port} if port else held


async def find(conn: asyncpg.Connection, allocation_id: uuid.UUID, kind: str) -> uuid.UUID | None:
    return await conn.fetchval("SELECT id FROM sagas WHERE allocation_id=$1 AND kind=$2", allocation_id, kind)


async def placed(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> Saga | None:
    """The saga that placed the allocation where it runs: its latest allocate or reschedule saga that has not
    failed (locked, with its steps), or None. It may still be running: the allocation turns ACTIVE at its last
    step, before the coordinator has read that step's reply."""
    saga_id = await conn.fetchval(
        "SELECT id FROM sagas WHERE allocation_id=$1 AND kind IN ('allocate', 'reschedule') "
        "AND status IN ('running', 'completed') ORDER BY attempt DESC LIMIT 1", allocation_id)
    loaded = await get(conn, saga_id) if saga_id is not None else None
    return loaded[0] if loaded else None
