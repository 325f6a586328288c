"""Node health in the scheduler schema (asyncpg; the caller owns the transaction): each node's health row and
history, the classification policy, the breakers, and the placements the monitor compares heartbeats with."""
from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import asyncpg

Row = dict[str, Any]


def _decode(row: asyncpg.Record) -> Row:
    out = dict(row)
    for key in ("alerts", "acted"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    return out


async def seed_policy(conn: asyncpg.Connection, defaults: Mapping[str, tuple[tuple[str, ...], str]]) -> None:
    """Insert the default classification of every condition the provider has not set (idempotent)."""
    await conn.executemany(
        "INSERT INTO health_policy (condition, classifications, note) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
        [(cond, list(classes), note) for cond, (classes, note) in defaults.items()])


async def policy(conn: asyncpg.Connection) -> dict[str, tuple[str, ...]]:
    rows = await conn.fetch("SELECT condition, classifications FROM health_policy")
    return {r["condition"]: tuple(r["classifications"]) for r in rows}


async def policy_rows(conn: asyncpg.Connection) -> list[Row]:
    return [dict(r) for r in await conn.fetch(
        "SELECT condition, classifications, note, version FROM health_policy ORDER BY condition")]


async def set_policy(conn: asyncpg.Connection, condition: str, classifications: list[str], note: str) -> Row:
    """Set one condition's classifications (a new condition or a change); returns its row with the new version."""
    row = await conn.fetchrow(
        "INSERT INTO health_policy (condition, classifications, note) VALUES ($1, $2, $3) "
        "ON CONFLICT (condition) DO UPDATE SET classifications = EXCLUDED.classifications, note = EXCLUDED.note, "
        "version = health_policy.version + 1 RETURNING condition, classifications, note, version",
        condition, classifications, note)
    return dict(row)


async def monitored(conn: asyncpg.Connection) -> dict[uuid.UUID, Row]:
    """Every node with a health row, with its pool and cordon (the nodes the monitor judges)."""
    rows = await conn.fetch(
        "SELECT h.*, n.pool, n.cordoned FROM node_health h JOIN nodes n ON n.id = h.node_id")
    return {r["node_id"]: _decode(r) for r in rows}


async def node(conn: asyncpg.Connection, node_id: uuid.UUID, *, lock: bool = False) -> Row | None:
    row = await conn.fetchrow(
        "SELECT h.*, n.pool, n.cordoned FROM node_health h JOIN nodes n ON n.id = h.node_id WHERE h.node_id = $1"
        + (" FOR UPDATE OF h" if lock else ""), node_id)
    return _decode(row) if row else None


async def start_watching(conn: asyncpg.Connection, node_id: uuid.UUID, at: datetime) -> bool:
    """A first heartbeat from a known node: it is judged from now on. False for a node the scheduler does not
    know (an agent that started before its node was declared)."""
    return bool(await conn.fetchval(
        "INSERT INTO node_health (node_id, state, since, last_seen) SELECT $1, 'unknown', $2, $2 "
        "WHERE EXISTS (SELECT 1 FROM nodes WHERE id = $1) ON CONFLICT DO NOTHING RETURNING true", node_id, at))


async def save(conn: asyncpg.Connection, node_id: uuid.UUID, fields: Row, event: str) -> Row:
    """Change the node's health row (bumping its version) and keep the change in its history; returns the row."""
    cols = list(fields)
    sets = ", ".join(f"{c}=${i + 2}" + ("::jsonb" if c in ("alerts", "acted") else "") for i, c in enumerate(cols))
    values = [json.dumps(fields[c], default=str) if c in ("alerts", "acted") else fields[c] for c in cols]
    row = await conn.fetchrow(
        f"UPDATE node_health SET {sets}, version = version + 1 WHERE node_id = $1 RETURNING *", node_id, *values)
    out = _decode(row)
    await conn.execute("INSERT INTO node_health_history (node_id, state, event, alerts) VALUES ($1, $2, $3, $4::jsonb)",
                       node_id, out["state"], event, json.dumps(out["alerts"], default=str))
    return out


async def history(conn: asyncpg.Connection, node_id: uuid.UUID, limit: int = 100) -> list[Row]:
    rows = await conn.fetch("SELECT at, state, event, alerts FROM node_health_history WHERE node_id = $1 "
                            "ORDER BY id DESC LIMIT $2", node_id, limit)
    return [_decode(r) for r in rows]


async def placements(conn: asyncpg.Connection, node_id: uuid.UUID) -> list[Row]:
    """The allocations placed on the node: allocation_id, tenant_id."""
    return [dict(r) for r in await conn.fetch(
        "SELECT allocation_id, tenant_id FROM allocations WHERE node_id = $1 ORDER BY placed_at", node_id)]


async def placed_on(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Which of ``allocation_ids`` are placed on the node."""
    return {r["allocation_id"] for r in await conn.fetch(
        "SELECT allocation_id FROM allocations WHERE node_id = $1 AND allocation_id = ANY($2::uuid[])",
        node_id, allocation_ids)}


async def pool_size(conn: asyncpg.Connection, pool: str) -> int:
    return await conn.fetchval("SELECT count(*) FROM nodes WHERE pool = $1 AND status = 'schedulable'", pool)


async def breaker(conn: asyncpg.Connection, pool: str) -> Row:
    """The pool's breaker row, locked (made closed on first use)."""
    await conn.execute("INSERT INTO health_breakers (pool) VALUES ($1) ON CONFLICT DO NOTHING", pool)
    return dict(await conn.fetchrow("SELECT * FROM health_breakers WHERE pool = $1 FOR UPDATE", pool))


async def save_breaker(conn: asyncpg.Connection, pool: str, open_: bool, opened_at: datetime | None,
                       cordons: list[datetime]) -> Row:
    return dict(await conn.fetchrow(
        "UPDATE health_breakers SET open = $2, opened_at = $3, cordons = $4, version = version + 1 WHERE pool = $1 "
        "RETURNING *", pool, open_, opened_at, cordons))
