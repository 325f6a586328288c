"""allocation_wipes and slot_wipes: the evidence of every slot wipe the node-agents reported (asyncpg; the caller
owns the transaction). The projection writes them (``wipe_projection``); GET /v1/allocations/{id}/wipe reads
them.

A release's wipe is recorded once per allocation and slot; a re-wipe once per request. A re-wipe is linked to
the allocation whose release left the slot quarantined (the newest release wipe of that slot, while that
allocation's last word on the slot is a failure), so the allocation's wipe shows how its slot was finally
erased."""
from __future__ import annotations

import json
import uuid

import asyncpg

_SLOT_COLS = "slot, ok, reason, evidence, request_id, requested_by, recorded_at"


async def record_release(conn: asyncpg.Connection, allocation_id: uuid.UUID, node_id: uuid.UUID,
                         event_id: uuid.UUID, quarantine: list[dict], slots: list[dict]) -> bool:
    """Record a release's wipe: ``quarantine`` [{slot, reason}], ``slots`` [{slot, ok, reason, evidence}]. False
    when it was recorded already (nothing changes)."""
    added = await conn.fetchval(
        "INSERT INTO allocation_wipes (allocation_id, node_id, event_id, quarantine) VALUES ($1, $2, $3, $4::jsonb) "
        "ON CONFLICT (allocation_id) DO NOTHING RETURNING 1", allocation_id, node_id, event_id, json.dumps(quarantine))
    if not added:
        return False
    await conn.executemany(
        "INSERT INTO slot_wipes (node_id, slot, allocation_id, ok, reason, evidence, event_id) "
        "VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7) ON CONFLICT (allocation_id, slot) WHERE request_id IS NULL "
        "DO NOTHING",
        [(node_id, s["slot"], allocation_id, s["ok"], s["reason"], json.dumps(s["evidence"]), event_id) for s in slots])
    return True


async def quarantined_by(conn: asyncpg.Connection, node_id: uuid.UUID, slot: int) -> uuid.UUID | None:
    """The allocation whose release left the slot quarantined: the newest release wipe of the slot, if that
    allocation's latest evidence for it (its release's, or a re-wipe since) is a failure."""
    return await conn.fetchval(
        "WITH latest AS (SELECT allocation_id FROM slot_wipes WHERE node_id=$1 AND slot=$2 AND request_id IS NULL "
        "ORDER BY id DESC LIMIT 1) "
        "SELECT l.allocation_id FROM latest l WHERE NOT (SELECT w.ok FROM slot_wipes w WHERE w.node_id=$1 "
        "AND w.slot=$2 AND w.allocation_id = l.allocation_id ORDER BY w.id DESC LIMIT 1)", node_id, slot)


async def record_rewipe(conn: asyncpg.Connection, request_id: uuid.UUID, node_id: uuid.UUID, slot: int, ok: bool,
                        reason: str | None, evidence: dict, requested_by: uuid.UUID, event_id: uuid.UUID,
                        allocation_id: uuid.UUID | None) -> bool:
    """Record a re-wipe's evidence, once per request; False when it was recorded already."""
    return bool(await conn.fetchval(
        "INSERT INTO slot_wipes (node_id, slot, allocation_id, request_id, requested_by, ok, reason, evidence, "
        "event_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9) ON CONFLICT (request_id) "
        "WHERE request_id IS NOT NULL DO NOTHING RETURNING 1",
        node_id, slot, allocation_id, request_id, requested_by, ok, reason, json.dumps(evidence), event_id))


def _decoded(row: asyncpg.Record, key: str) -> dict:
    out = dict(row)
    if isinstance(out[key], str):
        out[key] = json.loads(out[key])
    return out


async def of_allocation(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> tuple[dict | None, list[dict]]:
    """(the release's wipe or None, the latest evidence of each of its slots, by slot)."""
    wipe = await conn.fetchrow("SELECT allocation_id, node_id, quarantine, recorded_at FROM allocation_wipes "
                               "WHERE allocation_id=$1", allocation_id)
    rows = await conn.fetch(f"SELECT DISTINCT ON (slot) {_SLOT_COLS} FROM slot_wipes WHERE allocation_id=$1 "
                            "ORDER BY slot, id DESC", allocation_id)
    return (_decoded(wipe, "quarantine") if wipe else None), [_decoded(r, "evidence") for r in rows]
