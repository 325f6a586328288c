"""The node's instances in the node_agent schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import uuid

import asyncpg

from ..domain.model import Instance


async def lock_allocation(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID) -> None:
    """Serialise every command for one allocation on one node until the transaction ends (may block).

    Without it a compensation could run while the provision it compensates is
    still inside the driver: the late provision would then overwrite the
    tombstone and leave an instance nobody will remove.
    """
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"node_agent:{node_id}:{allocation_id}")


async def record(conn: asyncpg.Connection, node_id: uuid.UUID, instance: Instance) -> None:
    """Insert or refresh the instance row of the allocation (idempotent)."""
    await conn.execute(
        "INSERT INTO instances (node_id, allocation_id, instance_id, slots, state) VALUES ($1, $2, $3, $4, 'running') "
        "ON CONFLICT (node_id, allocation_id) DO UPDATE SET instance_id = EXCLUDED.instance_id, slots = EXCLUDED.slots",
        node_id, instance.allocation_id, instance.instance_id, list(instance.slots))


async def forget(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID) -> str | None:
    """Delete the allocation's row; returns the instance id it held, or None when there was none."""
    return await conn.fetchval("DELETE FROM instances WHERE node_id=$1 AND allocation_id=$2 RETURNING instance_id",
                               node_id, allocation_id)


async def get(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID) -> Instance | None:
    row = await conn.fetchrow("SELECT allocation_id, instance_id, slots FROM instances WHERE node_id=$1 AND allocation_id=$2",
                              node_id, allocation_id)
    return Instance(row["allocation_id"], row["instance_id"], tuple(row["slots"])) if row else None
