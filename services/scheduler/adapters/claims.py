"""The claim path: charge quota and take slots, conditionally, all or nothing (asyncpg + the schema's
``claim`` function, one round trip).

Why no slot is ever given twice and no quota ever overrun, whatever the in-memory index believed:
each UPDATE carries its own condition (a slot only ``WHERE allocation_id IS NULL``, a quota only
``WHERE used + n <= limit``, a tenant without a quota for (model, pool) may not allocate there) and
PostgreSQL re-checks that condition on the newest row version when a concurrent transaction committed
first. The affected row counts tell whether the claim held; if not, the function's subtransaction rolls
back and nothing of the claim remains. Lock order is always tenant quota row → user quota row → slot rows
(one UPDATE, index order) → the node's capacity row, so concurrent claims cannot deadlock.

Capacity: every claim and release raises the node's capacity sequence in its own transaction and counts
the node's free slots after it (the schema's ``capacity_changed``; 0002_capacity_and_shape_guard.sql), so
the replies can carry a (free slots, seq) pair a read model applies only when newer. A transaction that
claims several times (the queue placing requests) claims with ``count=False`` and calls ``capacity_changed``
once at the end for all its nodes, in node order: the capacity rows stay its last locks, never held while
it waits for a quota row.

The shape guard: a claim holds its shape's advisory lock (shared) until it commits and refuses a deleted
shape (ShapeDeleted); ``shape_users`` takes that lock exclusively before counting who uses the shape, so a
deletion never misses a claim in flight, and a claim that waited for the deletion sees it.
"""
from __future__ import annotations

import json
import uuid

import asyncpg

# the claim's vocabulary lives in the domain (the repository port speaks it); callers still find it here
from ..domain.claims import NIL, Claim, QuotaExceeded, ShapeDeleted, SlotTaken, quota_name  # noqa: F401


async def claim(conn: asyncpg.Connection, c: Claim, *, count: bool = True) -> tuple[list[dict], dict | None]:
    """Charge quota, take the slots and record the allocation, all or nothing, in one round trip (the
    schema's ``claim`` function runs the conditional statements above in a subtransaction). Returns (slot
    details, the node's capacity after the claim: {"free_slots", "seq"}; None with ``count=False``, when
    the caller calls ``capacity_changed`` itself later). Raises QuotaExceeded, SlotTaken or ShapeDeleted,
    leaving nothing."""
    out = json.loads(await conn.fetchval(
        "SELECT claim($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14)", c.allocation_id, c.tenant_id, c.user_id,
        c.node_id, list(c.slots), c.shape, c.gpu_model, c.pool, c.units, c.priority, c.spot, c.mig_profile,
        c.mig_per_gpu, count))
    if "error" in out:
        raise _refusal(c, out)
    return out["details"], out.get("capacity")


def _refusal(c: Claim, out: dict) -> Exception:
    """The exception a refused claim's answer ({"error": ...}) stands for, naming the claim (``.claim``)."""
    error = out["error"]
    if error == "taken":
        exc = SlotTaken(f"slots {list(c.slots)} of node {c.node_id} are not all free (or the node is not schedulable)")
    elif error == "quota":
        exc = QuotaExceeded(quota_name(c.tenant_id, c.gpu_model, c.pool, out["user"]), out["limit"], out["used"],
                            c.units)
    else:
        exc = ShapeDeleted(f"shape {c.shape!r} was deleted")
    exc.claim = c
    return exc


async def claim_all(conn: asyncpg.Connection, cs: list[Claim]) -> dict[uuid.UUID, dict]:
    """Make every claim or none, in one round trip (the schema's ``claim_all``: each the ordinary claim, without
    counting, then their nodes counted once, in node order). Returns node id -> {"free_slots", "seq"}. Raises
    the first refused claim's QuotaExceeded, SlotTaken or ShapeDeleted (``.claim``: that claim), leaving nothing."""
    out = json.loads(await conn.fetchval("SELECT claim_all($1::jsonb)", _document(cs)))
    if "error" in out:
        raise _refusal(cs[out["at"]], out)
    return {uuid.UUID(k): v for k, v in out["capacity"].items()}


async def claim_each(conn: asyncpg.Connection, cs: list[Claim]) -> list[tuple[list[dict], dict] | Exception]:
    """Make each claim on its own (a refused one leaves nothing, the others stand), counting its node, in one
    round trip (the schema's ``claim_each``): per claim, in order, (slot details, the node's capacity after it)
    or the QuotaExceeded, SlotTaken or ShapeDeleted that refused it."""
    out = json.loads(await conn.fetchval("SELECT claim_each($1::jsonb)", _document(cs)))
    return [_refusal(c, o) if "error" in o else (o["details"], o["capacity"]) for c, o in zip(cs, out, strict=True)]


def _document(cs: list[Claim]) -> str:
    """Claims as the schema's functions read them (a JSON array)."""
    return json.dumps([{
        "allocation_id": str(c.allocation_id), "tenant_id": str(c.tenant_id),
        "user_id": str(c.user_id) if c.user_id else None, "node_id": str(c.node_id), "slots": list(c.slots),
        "shape": c.shape, "gpu_model": c.gpu_model, "pool": c.pool, "units": c.units, "priority": c.priority,
        "spot": c.spot, "mig_profile": c.mig_profile, "mig_per_gpu": c.mig_per_gpu} for c in cs])


async def capacity_changed(conn: asyncpg.Connection, node_ids) -> dict[uuid.UUID, dict]:
    """Raise the capacity sequence of each node (in node order) and count its free slots, after slot rows of
    those nodes changed in this transaction: node id -> {"free_slots", "seq"}."""
    nodes = sorted(set(node_ids))
    if not nodes:
        return {}
    out = json.loads(await conn.fetchval("SELECT capacity_changed($1::uuid[])", nodes))
    return {uuid.UUID(k): v for k, v in out.items()}


async def capacity(conn: asyncpg.Connection, node_id: uuid.UUID) -> dict:
    """The node's capacity as committed (and as this transaction changed it), without raising its sequence:
    {"free_slots", "seq"}, a consistent pair (one statement, one snapshot)."""
    row = await conn.fetchrow("SELECT node_free_slots($1) AS free_slots, coalesce((SELECT seq FROM node_capacity "
                              "WHERE node_id=$1), 0) AS seq", node_id)
    return dict(row)


async def held(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> dict | None:
    row = await conn.fetchrow("SELECT * FROM allocations WHERE allocation_id=$1", allocation_id)
    return dict(row) if row else None


async def holdings(conn: asyncpg.Connection, node_id: uuid.UUID | None = None,
                   known: list[uuid.UUID] = ()) -> list[dict]:
    """Every allocation row; with ``node_id``, that node's, less the ``known`` ones."""
    if node_id is None:
        return [dict(r) for r in await conn.fetch("SELECT * FROM allocations")]
    return [dict(r) for r in await conn.fetch(
        "SELECT * FROM allocations WHERE node_id=$1 AND NOT (allocation_id = ANY($2::uuid[]))", node_id, list(known))]


async def holdings_on(conn: asyncpg.Connection, node_id: uuid.UUID) -> int:
    """How many allocations hold slots on the node."""
    return await conn.fetchval("SELECT count(*) FROM allocations WHERE node_id=$1", node_id)


async def quota_used(conn: asyncpg.Connection, tenant_id: uuid.UUID, gpu_model: str, pool: str) -> int | None:
    """What the tenant's own quota row counts as used (None: it has none)."""
    return await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1 AND gpu_model=$2 AND pool=$3 AND "
                               "user_id=$4", tenant_id, gpu_model, pool, NIL)


async def slot_details(conn: asyncpg.Connection, node_id: uuid.UUID, slots: list[int]) -> list[dict]:
    rows = await conn.fetch("SELECT detail FROM slots WHERE node_id=$1 AND idx = ANY($2::int[]) ORDER BY idx",
                            node_id, slots)
    return [json.loads(r["detail"]) for r in rows]


async def release(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> tuple[dict | None, dict | None]:
    """Free what the allocation holds and refund its quota, in one round trip (the schema's ``release_held``).
    Returns (the allocation row or None when it held nothing, the node's capacity after the release:
    {"free_slots", "seq"}, or None). Idempotent. Locks in the claim's order (quota rows, then slot rows, then
    the node's capacity row): the reverse order deadlocked against a concurrent claim of the same tenant.
    The row comes back as JSON: its ids are made UUIDs again; ``placed_at`` stays an ISO text."""
    out = await conn.fetchval("SELECT release_held($1)", allocation_id)
    return _released(json.loads(out) if out is not None else {"held": None, "capacity": None})


async def withdraw(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> tuple[dict | None, dict | None, dict | None]:
    """``release``, then take the allocation's request out of the queue should it wait there, in one round trip
    (the schema's ``withdraw``): (the allocation row or None, the node's capacity or None, the pending row or
    None). Idempotent."""
    return _withdrawn(json.loads(await conn.fetchval("SELECT withdraw($1)", allocation_id)))


async def withdraw_each(conn: asyncpg.Connection, allocation_ids: list[uuid.UUID]
                        ) -> list[tuple[dict | None, dict | None, dict | None]]:
    """``withdraw`` for each allocation, in order, in one round trip (the schema's ``withdraw_each``: a batch of
    releases): per allocation, what ``withdraw`` answers. An allocation named twice is found empty the second
    time."""
    out = json.loads(await conn.fetchval("SELECT withdraw_each($1::uuid[])", allocation_ids))
    return [_withdrawn(o) for o in out]


def _withdrawn(out: dict) -> tuple[dict | None, dict | None, dict | None]:
    row, capacity = _released(out)
    return row, capacity, out["queued"]


def _released(out: dict) -> tuple[dict | None, dict | None]:
    row = out["held"]
    if row is None:
        return None, None
    for key in ("allocation_id", "tenant_id", "user_id", "node_id"):
        if row[key] is not None:
            row[key] = uuid.UUID(row[key])
    return row, out["capacity"]


async def shape_users(conn: asyncpg.Connection, name: str) -> tuple[int, int]:
    """Before deleting shape ``name``: (how many allocations use it, placed or queued; how many other live
    shapes the platform has). Deletions take turns (one lock for all), and each takes the shape's lock
    exclusively first: it waits for the claims of the shape in flight, and new ones wait for it (see the
    shape guard above); held until the transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('scheduler.shapes', 0))")
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('scheduler.shape:' || $1, 0))", name)
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM allocations WHERE shape=$1) + (SELECT count(*) FROM pending "
        "WHERE request->>'shape' = $1) AS users, (SELECT count(*) FROM shapes WHERE NOT deleted AND name <> $1) AS others",
        name)
    return row["users"], row["others"]


async def hold_shape(conn: asyncpg.Connection, name: str) -> bool:
    """Take the shape guard (shared) for a request that waits in the queue, as a claim does: False when the
    shape is deleted (a deletion committed first). Held until the transaction ends."""
    return await conn.fetchval("SELECT hold_shape($1)", name)
