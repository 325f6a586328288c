"""node_health_view and its history, health_policy_view, health_breakers_view and fault_injections (asyncpg; the
caller owns the transaction). ``health_projection`` writes the scheduler's and the node-agents' documents; the
routes of ``health`` and ``faults`` read them (and record the faults they send)."""
from __future__ import annotations

import json
import uuid
from datetime import datetime

import asyncpg

from services.scheduler.contracts.health import BreakerChanged, HealthPolicyChanged, NodeHealthChanged

from ...adapters.versioned import upsert_newer

HISTORY = 100   # the changes a node's health document shows

_NOW = {"changed_at": "now()"}
_HEALTH = upsert_newer("node_health_view", ["node_id"],
                       ["node_id", "pool", "state", "since", "last_seen", "alerts", "cordoned_by", "draining",
                        "drain_deadline", "breaker_open", "version"], jsonb={"alerts"}, assign=_NOW, returning=True)
_POLICY = upsert_newer("health_policy_view", ["condition"],
                       ["condition", "classifications", "note", "requested_by", "version"], jsonb={"classifications"},
                       assign=_NOW, returning=True)
_BREAKER = upsert_newer("health_breakers_view", ["pool"],
                        ["pool", "open", "opened_at", "cordons_in_window", "share", "window_s", "version"],
                        assign=_NOW, returning=True)


def _decoded(row: asyncpg.Record | None, *keys: str) -> dict | None:
    if row is None:
        return None
    out = dict(row)
    for k in keys:
        if isinstance(out.get(k), str):
            out[k] = json.loads(out[k])
    return out


# --- writes (the projection) -------------------------------------------------------------------------

async def apply_health(conn: asyncpg.Connection, d: NodeHealthChanged, at: datetime) -> bool:
    """The document, if newer than the row; its history line either way (once per version). True: applied."""
    await conn.execute(
        "INSERT INTO node_health_history (node_id, version, state, event, alerts, occurred_at) "
        "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING", d.node_id, d.version, d.state, d.event,
        len(d.alerts), at)
    alerts = json.dumps([a.model_dump(mode="json") for a in d.alerts])
    return bool(await conn.fetchval(_HEALTH, d.node_id, d.pool, d.state, d.since, d.last_seen, alerts,
                                    d.cordoned_by, d.draining, d.drain_deadline, d.breaker_open, d.version))


async def apply_policy(conn: asyncpg.Connection, d: HealthPolicyChanged) -> bool:
    return bool(await conn.fetchval(_POLICY, d.condition, json.dumps(d.classifications), d.note, d.requested_by,
                                    d.version))


async def apply_breaker(conn: asyncpg.Connection, d: BreakerChanged) -> bool:
    return bool(await conn.fetchval(_BREAKER, d.pool, d.open, d.opened_at, d.cordons_in_window, d.share, d.window_s,
                                    d.version))


async def record_fault(conn: asyncpg.Connection, request_id: uuid.UUID, node_id: uuid.UUID, fault: dict,
                       requested_by: uuid.UUID) -> dict:
    """The fault as sent (``fault``: kind, gpu, code, value, duration_s)."""
    return _decoded(await conn.fetchrow(
        "INSERT INTO fault_injections (request_id, node_id, kind, gpu, code, value, duration_s, requested_by) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING *", request_id, node_id, fault["kind"], fault.get("gpu"),
        fault.get("code"), fault.get("value"), fault.get("duration_s"), requested_by))


async def answer_fault(conn: asyncpg.Connection, request_id: uuid.UUID, node_id: uuid.UUID, kind: str,
                       accepted: bool, reason: str) -> None:
    """The node's answer (a fault sent by another than this gateway is recorded with it)."""
    await conn.execute(
        "INSERT INTO fault_injections (request_id, node_id, kind, accepted, reason, answered_at) "
        "VALUES ($1, $2, $3, $4, $5, now()) ON CONFLICT (request_id) DO UPDATE SET accepted=EXCLUDED.accepted, "
        "reason=EXCLUDED.reason, answered_at=EXCLUDED.answered_at", request_id, node_id, kind, accepted, reason)


# --- reads (the routes) ------------------------------------------------------------------------------

async def node_health(conn: asyncpg.Connection, node_id: uuid.UUID) -> dict | None:
    """The node's health document (with its name), or None when neither the node nor its health is known; a
    known node without a document: state unknown, version 0."""
    row = await conn.fetchrow(
        "SELECT coalesce(h.node_id, n.id) AS node_id, n.name, coalesce(h.pool, n.pool) AS pool, "
        "coalesce(h.state, 'unknown') AS state, h.since, h.last_seen, coalesce(h.alerts, '[]'::jsonb) AS alerts, "
        "h.cordoned_by, coalesce(h.draining, false) AS draining, h.drain_deadline, "
        "coalesce(h.breaker_open, false) AS breaker_open, coalesce(h.version, 0) AS version "
        "FROM (SELECT $1::uuid AS id) k LEFT JOIN nodes_view n ON n.id = k.id "
        "LEFT JOIN node_health_view h ON h.node_id = k.id WHERE n.id IS NOT NULL OR h.node_id IS NOT NULL", node_id)
    return _decoded(row, "alerts")


async def history(conn: asyncpg.Connection, node_id: uuid.UUID, limit: int = HISTORY) -> list[dict]:
    rows = await conn.fetch("SELECT version, state, event, alerts, occurred_at AS at FROM node_health_history "
                            "WHERE node_id=$1 ORDER BY version DESC LIMIT $2", node_id, limit)
    return [dict(r) for r in rows]


async def fleet(conn: asyncpg.Connection, state: str | None = None) -> list[dict]:
    """Every node the gateway knows, by name, with its health state (``state``: only those in it)."""
    rows = await conn.fetch(
        "SELECT n.id AS node_id, n.name, coalesce(h.pool, n.pool) AS pool, coalesce(h.state, 'unknown') AS state, "
        "h.since, coalesce(jsonb_array_length(h.alerts), 0) AS alerts, h.cordoned_by, "
        "coalesce(h.draining, false) AS draining, coalesce(h.breaker_open, false) AS breaker_open "
        "FROM nodes_view n LEFT JOIN node_health_view h ON h.node_id = n.id "
        "WHERE $1::text IS NULL OR coalesce(h.state, 'unknown') = $1 ORDER BY n.name, n.id", state)
    return [dict(r) for r in rows]


async def policy(conn: asyncpg.Connection) -> list[dict]:
    rows = await conn.fetch("SELECT condition, classifications, note, requested_by, version, changed_at "
                            "FROM health_policy_view ORDER BY condition")
    return [_decoded(r, "classifications") for r in rows]


async def breakers(conn: asyncpg.Connection) -> list[dict]:
    rows = await conn.fetch("SELECT pool, open, opened_at, cordons_in_window, share, window_s, version "
                            "FROM health_breakers_view ORDER BY pool")
    return [dict(r) for r in rows]


async def pool_known(conn: asyncpg.Connection, pool: str) -> bool:
    """A pool the scheduler defined, or one whose breaker it announced."""
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pools_view WHERE name=$1) OR "
                                    "EXISTS (SELECT 1 FROM health_breakers_view WHERE pool=$1)", pool))


async def fault(conn: asyncpg.Connection, node_id: uuid.UUID, request_id: uuid.UUID) -> dict | None:
    return _decoded(await conn.fetchrow("SELECT * FROM fault_injections WHERE request_id=$1 AND node_id=$2",
                                        request_id, node_id))
