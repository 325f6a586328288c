"""Nodes and slots in the scheduler schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import json
import uuid

import asyncpg

from ..domain.model import NodeSpec, NodeView, Placement

_VIEW = (
    "SELECT n.id, n.name, n.gpu_model, n.cordoned, "
    "coalesce(array_agg(s.idx ORDER BY s.idx) FILTER (WHERE s.idx IS NOT NULL AND s.allocation_id IS NULL), '{}') AS free "
    "FROM nodes n LEFT JOIN slots s ON s.node_id = n.id "
)


def _spec(row: asyncpg.Record) -> NodeSpec:
    return NodeSpec(row["id"], row["name"], row["gpu_model"], row["gpu_count"], json.loads(row["labels"]))


def _view(row: asyncpg.Record) -> NodeView:
    return NodeView(row["id"], row["name"], row["gpu_model"], tuple(row["free"]), row["cordoned"])


async def add_node(conn: asyncpg.Connection, spec: NodeSpec) -> bool:
    """Insert the node and its free slots 0..gpu_count-1; False (no change) if the id or the name exists."""
    inserted = await conn.fetchval(
        "INSERT INTO nodes (id, name, gpu_model, gpu_count, labels) VALUES ($1,$2,$3,$4,$5::jsonb) "
        "ON CONFLICT DO NOTHING RETURNING true",
        spec.id, spec.name, spec.gpu_model, spec.gpu_count, json.dumps(spec.labels))
    if inserted:
        await conn.execute("INSERT INTO slots (node_id, idx) SELECT $1, generate_series(0, $2 - 1)", spec.id, spec.gpu_count)
    return bool(inserted)


async def get_node(conn: asyncpg.Connection, node_id: uuid.UUID) -> NodeSpec | None:
    row = await conn.fetchrow("SELECT * FROM nodes WHERE id=$1", node_id)
    return _spec(row) if row else None


async def get_node_by_name(conn: asyncpg.Connection, name: str) -> NodeSpec | None:
    row = await conn.fetchrow("SELECT * FROM nodes WHERE name=$1", name)
    return _spec(row) if row else None


async def capacity(conn: asyncpg.Connection) -> list[NodeView]:
    """Every schedulable node and its free slots, as committed now (no locks)."""
    rows = await conn.fetch(_VIEW + "WHERE NOT n.cordoned GROUP BY n.id")
    return [_view(r) for r in rows]


async def lock_node(conn: asyncpg.Connection, node_id: uuid.UUID) -> NodeView | None:
    """Lock the node row until the transaction ends (blocks while another reservation holds it), then
    read its free slots afresh: under READ COMMITTED this sees every reservation committed before us."""
    if await conn.fetchval("SELECT 1 FROM nodes WHERE id=$1 FOR UPDATE", node_id) is None:
        return None
    row = await conn.fetchrow(_VIEW + "WHERE n.id=$1 GROUP BY n.id", node_id)
    return _view(row)


async def claim(conn: asyncpg.Connection, p: Placement, allocation_id: uuid.UUID) -> int:
    """Give the placement's slots to the allocation if they are still free; returns how many it got."""
    status = await conn.execute(
        "UPDATE slots SET allocation_id=$3, reserved_at=now() "
        "WHERE node_id=$1 AND idx = ANY($2::int[]) AND allocation_id IS NULL",
        p.node_id, list(p.slots), allocation_id)
    return int(status.split()[-1])


async def held_by(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> Placement | None:
    """The slots the allocation holds (always on one node), or None."""
    row = await conn.fetchrow(
        "SELECT s.node_id, n.gpu_model, array_agg(s.idx ORDER BY s.idx) AS slots FROM slots s "
        "JOIN nodes n ON n.id = s.node_id WHERE s.allocation_id=$1 GROUP BY s.node_id, n.gpu_model", allocation_id)
    return Placement(row["node_id"], row["gpu_model"], tuple(row["slots"])) if row else None


async def release(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> int:
    """Free every slot the allocation holds; returns how many (0 when it held none)."""
    status = await conn.execute(
        "UPDATE slots SET allocation_id=NULL, reserved_at=NULL WHERE allocation_id=$1", allocation_id)
    return int(status.split()[-1])
