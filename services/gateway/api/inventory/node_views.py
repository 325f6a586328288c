"""nodes_view: nodes as requested through the API and as the scheduler confirmed them."""
from __future__ import annotations

import json
import uuid

import asyncpg

_COLS = "id, name, gpu_model, gpu_count, labels, status, requested_at, registered_at"


async def request_node(conn: asyncpg.Connection, node_id: uuid.UUID, name: str, gpu_model: str, gpu_count: int,
                       labels: dict[str, str], requested_by: uuid.UUID) -> asyncpg.Record | None:
    """The new 'registering' node, or None when the name is taken."""
    return await conn.fetchrow(
        f"INSERT INTO nodes_view (id, name, gpu_model, gpu_count, labels, status, requested_by, requested_at) "
        f"VALUES ($1, $2, $3, $4, $5::jsonb, 'registering', $6, now()) ON CONFLICT DO NOTHING RETURNING {_COLS}",
        node_id, name, gpu_model, gpu_count, json.dumps(labels), requested_by)


async def list_nodes(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(f"SELECT {_COLS} FROM nodes_view ORDER BY name")


def labels_of(row: asyncpg.Record) -> dict[str, str]:
    value = row["labels"]
    return json.loads(value) if isinstance(value, str) else dict(value or {})


async def exists(conn: asyncpg.Connection, node_id: uuid.UUID, *, lock: bool = False) -> bool:
    """The node is in nodes_view (``lock``: share-lock its row until the transaction ends)."""
    return bool(await conn.fetchval(f"SELECT 1 FROM nodes_view WHERE id=$1{' FOR SHARE' if lock else ''}", node_id))
