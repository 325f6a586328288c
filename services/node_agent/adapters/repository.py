"""The node's instances in the node_agent schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import uuid

import asyncpg
from pydantic import BaseModel

from ..domain.model import Instance


async def lock_allocation(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID) -> None:
    """Serialise every command for one allocation on one node until the transaction ends (may block).

    Without it a compensation could run while the provision it compensates is
    still inside the driver: the late provision would then overwrite the
    tombstone and leave an instance nobody will remove.
    """
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"node_agent:{node_id}:{allocation_id}")


async def record(conn: asyncpg.Connection, node_id: uuid.UUID, instance: Instance, command: BaseModel | None = None) -> None:
    """Insert or refresh the instance row of the allocation (idempotent); ``command``: the provision command, kept
    so a reconcile can make the instance again when it vanished."""
    await conn.execute(
        "INSERT INTO instances (node_id, allocation_id, instance_id, slots, state, command) "
        "VALUES ($1, $2, $3, $4, 'running', $5::jsonb) ON CONFLICT (node_id, allocation_id) DO UPDATE "
        "SET instance_id = EXCLUDED.instance_id, slots = EXCLUDED.slots, command = EXCLUDED.command",
        node_id, instance.allocation_id, instance.instance_id, list(instance.slots),
        command.model_dump_json() if command is not None else None)


async def keep_command(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID, command: BaseModel) -> None:
    """Replace the provision command kept with the allocation's instance (its volumes changed while it runs)."""
    await conn.execute("UPDATE instances SET command = $3::jsonb WHERE node_id=$1 AND allocation_id=$2",
                       node_id, allocation_id, command.model_dump_json())


async def try_lock_allocation(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID) -> bool:
    """``lock_allocation`` without waiting: False when a command for the allocation is being handled."""
    return await conn.fetchval("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))",
                               f"node_agent:{node_id}:{allocation_id}")


async def command_of(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID) -> str | None:
    """The provision command (JSON) the allocation's instance here was made from; None without a row (or an
    instance recorded before commands were kept)."""
    return await conn.fetchval("SELECT command FROM instances WHERE node_id=$1 AND allocation_id=$2",
                               node_id, allocation_id)


async def get_row(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID) -> asyncpg.Record | None:
    """The allocation's instance row here (with its command), or None."""
    return await conn.fetchrow("SELECT allocation_id, instance_id, slots, command FROM instances "
                               "WHERE node_id=$1 AND allocation_id=$2", node_id, allocation_id)


async def rows(conn: asyncpg.Connection, node_id: uuid.UUID) -> dict[uuid.UUID, asyncpg.Record]:
    """The node's instance rows by allocation (with the provision command each was made from)."""
    found = await conn.fetch("SELECT allocation_id, instance_id, slots, command FROM instances WHERE node_id=$1", node_id)
    return {r["allocation_id"]: r for r in found}


async def forget(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID) -> str | None:
    """Delete the allocation's row; returns the instance id it held, or None when there was none."""
    return await conn.fetchval("DELETE FROM instances WHERE node_id=$1 AND allocation_id=$2 RETURNING instance_id",
                               node_id, allocation_id)


async def get(conn: asyncpg.Connection, node_id: uuid.UUID, allocation_id: uuid.UUID) -> Instance | None:
    row = await conn.fetchrow("SELECT allocation_id, instance_id, slots FROM instances WHERE node_id=$1 AND allocation_id=$2",
                              node_id, allocation_id)
    return Instance(row["allocation_id"], row["instance_id"], tuple(row["slots"])) if row else None
