"""allocations_view, allocation_events and idempotency_keys (asyncpg; the caller owns the transaction).

The handlers and the projection share the view's rows; the projections alone append the events
(``append_event``: the allocations slice's and the wipes'), which the streams read here.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime

import asyncpg

from shared.envelope import Envelope

from .keyset import newest_first

EVENTS_CHANNEL = "gateway_allocation_events"
_COLS = ("id, tenant_id, name, shape, gpu_count, volume_gb, labels, state, node_id, failed_step, reason, "
         "release_requested_at, created_at, updated_at")
# what the tenant asked about placement, and the scheduler's queue, preemption and refusal (0003_scheduling.sql)
_COLS += (", priority, spot, pool, tolerations, fail_fast, network_id, placed, queue_position, queued_reason, "
          "cancel_requested_at, preemption, problem")
_COLS += ", image, instance"   # the image it boots and the instance the node made (0007_instances.sql)
_COLS += ", volumes, scratch_class"   # the volumes it mounts and its scratch volume's class (0010_volumes.sql)
_COLS += ", price"                   # the GPU-hour price quoted when it was created (0014_budgets.sql)
_COLS += ", interruption"            # its last interruption by a failed node (0019_interruptions.sql)


async def claim_idempotency_key(conn: asyncpg.Connection, tenant_id: uuid.UUID, key: str, request_hash: str,
                                allocation_id: uuid.UUID, response: dict) -> asyncpg.Record | None:
    """Claim ``key`` for this request: None when claimed, else the row of the request that holds it.

    Blocks while a concurrent transaction holds an uncommitted claim of the same key
    (the primary key serialises them); the loser then reads the winner's row.
    """
    claimed = await conn.fetchval(
        "INSERT INTO idempotency_keys (tenant_id, key, request_hash, allocation_id, response) "
        "VALUES ($1, $2, $3, $4, $5::jsonb) ON CONFLICT DO NOTHING RETURNING 1",
        tenant_id, key, request_hash, allocation_id, json.dumps(response))
    if claimed:
        return None
    return await conn.fetchrow("SELECT request_hash, allocation_id, response FROM idempotency_keys "
                               "WHERE tenant_id=$1 AND key=$2", tenant_id, key)


async def held_idempotency_key(conn: asyncpg.Connection, tenant_id: uuid.UUID, key: str) -> asyncpg.Record | None:
    """The committed request holding ``key``, if any (a claim in flight is not seen: ``claim_idempotency_key``
    waits for it)."""
    return await conn.fetchrow("SELECT request_hash, allocation_id, response FROM idempotency_keys "
                               "WHERE tenant_id=$1 AND key=$2", tenant_id, key)


async def purge_idempotency_keys(conn: asyncpg.Connection, older_than_s: float) -> int:
    result = await conn.execute("DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => $1)",
                                older_than_s)
    return int(result.split()[-1])


async def insert(conn: asyncpg.Connection, a: dict) -> None:
    """Insert a view row (``a`` holds every column but updated_at; the scheduling ones, image, volumes,
    scratch_class and price are optional); a row already there is kept."""
    await conn.execute(
        "INSERT INTO allocations_view (id, tenant_id, user_id, name, shape, gpu_count, volume_gb, labels, state, created_at, "
        "updated_at, priority, spot, pool, tolerations, fail_fast, network_id, image, volumes, scratch_class, price) VALUES "
        "($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $10, $11, $12, $13, $14::jsonb, $15, $16, $17, $18::jsonb, $19, "
        "$20::jsonb) "
        "ON CONFLICT (id) DO NOTHING",
        a["id"], a["tenant_id"], a["user_id"], a["name"], a["shape"], a["gpu_count"], a["volume_gb"],
        json.dumps(a["labels"]), a["state"], a["created_at"], a.get("priority") or 0, bool(a.get("spot")),
        a.get("pool"), json.dumps(a.get("tolerations") or []), bool(a.get("fail_fast")), a.get("network_id"),
        a.get("image"), json.dumps(a.get("volumes") or [], default=str), a.get("scratch_class"),
        json.dumps(a["price"], default=str) if a.get("price") is not None else None)


async def get(conn: asyncpg.Connection, allocation_id: uuid.UUID, tenant_id: uuid.UUID | None = None, *,
              for_update: bool = False) -> asyncpg.Record | None:
    """The row, only if it belongs to ``tenant_id`` (when given)."""
    lock = " FOR UPDATE" if for_update else ""
    if tenant_id is None:
        return await conn.fetchrow(f"SELECT {_COLS} FROM allocations_view WHERE id=$1{lock}", allocation_id)
    return await conn.fetchrow(f"SELECT {_COLS} FROM allocations_view WHERE id=$1 AND tenant_id=$2{lock}",
                               allocation_id, tenant_id)


async def move(conn: asyncpg.Connection, allocation_id: uuid.UUID, state: str, from_states: list[str],
               line_reason: str, **fields) -> bool:
    """Move the row to ``state`` and set ``fields`` (names are the caller's constants) when its state is one of
    ``from_states``, in one statement (the row's lock is taken and its state checked by the UPDATE itself); a row
    waiting with queued_reason ``line_reason`` leaves that line (its queue fields cleared). False: not moved (no
    such row, or not in ``from_states``)."""
    names = list(fields)
    sets = "".join(f"{n}=${i + 5}, " for i, n in enumerate(names))
    return bool(await conn.fetchval(
        f"UPDATE allocations_view SET {sets}state=$2, "
        "queue_position=CASE WHEN queued_reason=$4 THEN NULL ELSE queue_position END, "
        "queued_reason=CASE WHEN queued_reason=$4 THEN NULL ELSE queued_reason END, updated_at=now() "
        "WHERE id=$1 AND state = ANY($3::text[]) RETURNING true",
        allocation_id, state, from_states, line_reason, *[fields[n] for n in names]))


async def lock_state(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> asyncpg.Record | None:
    """The row's state, placed and queued_reason (what a projection decides a move by), locked until commit."""
    return await conn.fetchrow("SELECT state, placed, queued_reason FROM allocations_view WHERE id=$1 FOR UPDATE",
                               allocation_id)


async def page(conn: asyncpg.Connection, tenant_id: uuid.UUID, limit: int,
               after: tuple[datetime, uuid.UUID] | None) -> list[asyncpg.Record]:
    """Up to ``limit`` rows of the tenant, newest first, strictly older than the ``after`` position."""
    return await newest_first(conn, f"SELECT {_COLS} FROM allocations_view WHERE tenant_id=$1", [tenant_id], limit,
                              after)


async def update(conn: asyncpg.Connection, allocation_id: uuid.UUID, **fields) -> None:
    """Set the given columns (names are the caller's constants, never client input) and updated_at."""
    names = list(fields)
    sets = ", ".join(f"{n}=${i + 2}" for i, n in enumerate(names))
    await conn.execute(f"UPDATE allocations_view SET {sets}, updated_at=now() WHERE id=$1",
                       allocation_id, *[fields[n] for n in names])


async def events_after(conn: asyncpg.Connection, allocation_id: uuid.UUID, after_seq: int,
                       limit: int = 500) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT seq, event_id, type, envelope::text AS envelope FROM allocation_events "
                            "WHERE allocation_id=$1 AND seq>$2 ORDER BY seq LIMIT $3", allocation_id, after_seq, limit)


async def seq_of(conn: asyncpg.Connection, allocation_id: uuid.UUID, event_id: uuid.UUID) -> int | None:
    return await conn.fetchval("SELECT seq FROM allocation_events WHERE allocation_id=$1 AND event_id=$2",
                               allocation_id, event_id)


def labels_of(row: asyncpg.Record) -> dict[str, str]:
    value = row["labels"]
    return json.loads(value) if isinstance(value, str) else dict(value or {})


async def lock_events(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> None:
    """Serialise event appends per allocation until commit (``append_event`` takes this lock itself).

    A stream reads events by ``seq``; without this, an append that took seq 9 but
    commits after seq 10 would be skipped by a reader already past 10.
    """
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))", str(allocation_id))


async def append_event(conn: asyncpg.Connection, allocation_id: uuid.UUID, env: Envelope) -> bool:
    """Record the event (once per event id) under the allocation's ``lock_events`` lock (taken here, before the
    row takes its seq, and held until commit) and wake the streams watching the allocation on commit."""
    # one round trip: the lock (its CTE is the insert's only row source, so it is taken before the row's seq is
    # drawn), the insert, and the NOTIFY only when the row was added (delivered on commit)
    added = await conn.fetchval(
        "WITH locked AS MATERIALIZED (SELECT pg_advisory_xact_lock(hashtextextended($6, 7))), "
        "added AS (INSERT INTO allocation_events (event_id, allocation_id, type, envelope) "
        "SELECT $1::uuid, $2::uuid, $3::text, $4::jsonb FROM locked ON CONFLICT (event_id) DO NOTHING RETURNING 1) "
        "SELECT count(pg_notify($5, $6)) FROM added", env.id, allocation_id, env.type, env.model_dump_json(),
        EVENTS_CHANNEL, str(allocation_id))
    return bool(added)
