"""Nodes and their approved slots in the scheduler schema (asyncpg; the caller owns the transaction).

Every write bumps the node's ``version`` and returns nothing; ``document`` reads the whole node as the
``scheduler.node_changed`` payload, so each handler emits exactly what was committed. The version counts
document changes only: slots taken and freed raise the node's capacity sequence instead (claims.py), and
installing a slot map raises both.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

_NODE_COLUMNS = ("name", "gpu_model", "gpu_count", "pool", "region", "site", "rack", "labels", "taints",
                 "cordoned", "declared", "status", "driver", "topology", "proposal", "proposed_slot_map",
                 "approved_slot_map", "review", "burn_in")
_JSON = {"labels", "taints", "topology", "proposed_slot_map", "approved_slot_map", "review", "burn_in", "quarantined"}
# a node row with its quarantined slots ([{slot, reason, since}], slot order)
_SELECT = ("SELECT n.*, coalesce((SELECT jsonb_agg(jsonb_build_object('slot', s.idx, 'reason', s.quarantine_reason, "
           "'since', s.quarantined_at) ORDER BY s.idx) FROM slots s WHERE s.node_id = n.id "
           "AND s.quarantine_reason IS NOT NULL), '[]'::jsonb) AS quarantined FROM nodes n")


def _decode(row: asyncpg.Record) -> dict[str, Any]:
    out = dict(row)
    for key in _JSON & out.keys():
        if out[key] is not None:
            out[key] = json.loads(out[key])
    return out


async def get(conn: asyncpg.Connection, node_id: uuid.UUID, *, lock: bool = False) -> dict[str, Any] | None:
    """The node's row (JSON columns decoded), or None. ``lock`` serialises every writer of this node id
    until the transaction ends, even before the row exists (declare and discovery may race to create it)."""
    if lock:
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('scheduler.node:' || $1, 0))", str(node_id))
    row = await conn.fetchrow(f"{_SELECT} WHERE n.id=$1" + (" FOR UPDATE OF n" if lock else ""), node_id)
    return _decode(row) if row else None


async def name_holder(conn: asyncpg.Connection, name: str) -> uuid.UUID | None:
    return await conn.fetchval("SELECT id FROM nodes WHERE name=$1", name)


async def insert(conn: asyncpg.Connection, node_id: uuid.UUID, fields: dict[str, Any]) -> bool:
    """Create the node; False (nothing written) if the id or the name exists already."""
    cols = list(fields)
    values = [json.dumps(fields[c]) if c in _JSON else fields[c] for c in cols]
    placeholders = ", ".join(f"${i + 2}" + ("::jsonb" if c in _JSON else "") for i, c in enumerate(cols))
    return bool(await conn.fetchval(
        f"INSERT INTO nodes (id, {', '.join(cols)}) VALUES ($1, {placeholders}) ON CONFLICT DO NOTHING RETURNING true",
        node_id, *values))


async def update(conn: asyncpg.Connection, node_id: uuid.UUID, fields: dict[str, Any]) -> None:
    """Change the given columns and bump the version."""
    unknown = set(fields) - set(_NODE_COLUMNS)
    if unknown:
        raise ValueError(f"not node columns: {sorted(unknown)}")
    cols = list(fields)
    sets = ", ".join(f"{c}=${i + 2}" + ("::jsonb" if c in _JSON else "") for i, c in enumerate(cols))
    values = [json.dumps(fields[c]) if c in _JSON else fields[c] for c in cols]
    await conn.execute(f"UPDATE nodes SET {sets}, version = version + 1 WHERE id=$1", node_id, *values)


async def document(conn: asyncpg.Connection, node_id: uuid.UUID) -> dict[str, Any]:
    """The node as the ``scheduler.node_changed`` payload: free_slots = the node's free slots (unheld,
    whole, with a wipe policy, not retired: the schema's ``node_free_slots``) while it is schedulable, else
    0; capacity = that count whatever the status, with the capacity sequence it was counted at (one
    statement: a consistent pair)."""
    row = await conn.fetchrow(
        f"SELECT q.*, node_free_slots(q.id) AS free_slots, coalesce((SELECT c.seq FROM node_capacity c "
        f"WHERE c.node_id = q.id), 0) AS capacity_seq FROM ({_SELECT} WHERE n.id=$1) q", node_id)
    d = _decode(row)
    return {"node_id": d["id"], "name": d["name"], "status": d["status"], "pool": d["pool"], "region": d["region"],
            "site": d["site"], "rack": d["rack"], "gpu_model": d["gpu_model"], "gpu_count": d["gpu_count"],
            "labels": d["labels"], "taints": d["taints"], "cordoned": d["cordoned"],
            "proposal": d["proposal"] if d["proposed_slot_map"] is not None else None,
            "proposed_slot_map": d["proposed_slot_map"],
            "approved_slot_map": d["approved_slot_map"], "review": d["review"],
            "quarantined": d["quarantined"], "burn_in": d["burn_in"],
            "free_slots": d["free_slots"] if d["status"] == "schedulable" else 0, "version": d["version"],
            "capacity": {"free_slots": d["free_slots"], "seq": d["capacity_seq"]}}


async def install_slots(conn: asyncpg.Connection, node_id: uuid.UUID, slots: list[dict[str, Any]]) -> None:
    """Make the approved map's slots the node's slots: upsert each (held slots keep their allocation),
    retire the ones the map no longer has (a held one stays held until released, and is never reused).
    Raises the node's capacity sequence (the free slots changed)."""
    await conn.executemany(
        "INSERT INTO slots (node_id, idx, detail, wipe_policy) VALUES ($1, $2, $3::jsonb, $4) "
        "ON CONFLICT (node_id, idx) DO UPDATE SET detail = EXCLUDED.detail, "
        "wipe_policy = CASE WHEN slots.quarantine_reason IS NULL THEN EXCLUDED.wipe_policy ELSE '' END, "
        "retired = false",
        [(node_id, s["index"], json.dumps(s), s.get("wipe_policy") or "") for s in slots])
    await conn.execute("DELETE FROM slots WHERE node_id=$1 AND NOT (idx = ANY($2::int[])) AND allocation_id IS NULL",
                       node_id, [s["index"] for s in slots])
    await conn.execute("UPDATE slots SET retired = true WHERE node_id=$1 AND NOT (idx = ANY($2::int[]))",
                       node_id, [s["index"] for s in slots])
    await conn.execute("SELECT capacity_changed(ARRAY[$1::uuid])", node_id)


async def all_nodes(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Every node row (for loading the in-memory index)."""
    return [_decode(r) for r in await conn.fetch(f"{_SELECT} ORDER BY n.name")]


async def quarantine(conn: asyncpg.Connection, node_id: uuid.UUID, slots: dict[int, str]) -> list[int]:
    """Take the slots out of service with their reasons (wipe failed); returns the slots newly quarantined.
    Before the release frees them, so the count of free slots never includes them."""
    rows = await conn.fetch(
        "UPDATE slots s SET quarantine_reason = q.reason, quarantined_at = now(), wipe_policy = '' "
        "FROM unnest($2::int[], $3::text[]) AS q(idx, reason) WHERE s.node_id = $1 AND s.idx = q.idx "
        "AND s.quarantine_reason IS NULL RETURNING s.idx", node_id, list(slots), list(slots.values()))
    if rows:   # the document changed (its quarantined slots)
        await conn.execute("UPDATE nodes SET version = version + 1 WHERE id=$1", node_id)
    return sorted(r["idx"] for r in rows)


async def return_slot(conn: asyncpg.Connection, node_id: uuid.UUID, slot: int) -> bool:
    """A quarantined slot back in service with its approved policy (a re-wipe passed); False if it was not
    quarantined."""
    done = await conn.fetchval(
        "UPDATE slots SET quarantine_reason = NULL, quarantined_at = NULL, "
        "wipe_policy = coalesce(detail->>'wipe_policy', '') WHERE node_id=$1 AND idx=$2 "
        "AND quarantine_reason IS NOT NULL RETURNING true", node_id, slot)
    if done:
        await conn.execute("UPDATE nodes SET version = version + 1 WHERE id=$1", node_id)
        await conn.execute("SELECT capacity_changed(ARRAY[$1]::uuid[])", node_id)
    return bool(done)


async def renew_quarantine(conn: asyncpg.Connection, node_id: uuid.UUID, slot: int, reason: str) -> bool:
    """A quarantined slot's new reason (a re-wipe failed again); False if it was not quarantined."""
    if not await conn.fetchval("UPDATE slots SET quarantine_reason=$3 WHERE node_id=$1 AND idx=$2 "
                               "AND quarantine_reason IS NOT NULL RETURNING true", node_id, slot, reason):
        return False
    await conn.execute("UPDATE nodes SET version = version + 1 WHERE id=$1", node_id)
    return True
