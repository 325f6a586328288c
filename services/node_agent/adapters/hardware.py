"""The node's BMC and its wipe records in the node_agent schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import json
import uuid

import asyncpg

from ..contracts import Bmc, SetBmc, SlotWipe


async def keep_bmc(conn: asyncpg.Connection, cmd: SetBmc) -> bool:
    """Store the BMC unless a newer version is stored; True when this version is now the node's."""
    return bool(await conn.fetchval(
        "INSERT INTO bmcs (node_id, version, bmc, set_by) VALUES ($1, $2, $3::jsonb, $4) "
        "ON CONFLICT (node_id) DO UPDATE SET version = EXCLUDED.version, bmc = EXCLUDED.bmc, set_by = EXCLUDED.set_by, "
        "updated_at = now() WHERE bmcs.version < EXCLUDED.version RETURNING true",
        cmd.node_id, cmd.version, cmd.bmc.model_dump_json() if cmd.bmc else None, cmd.set_by))


async def bmc_of(conn: asyncpg.Connection, node_id: uuid.UUID) -> Bmc | None:
    raw = await conn.fetchval("SELECT bmc FROM bmcs WHERE node_id=$1", node_id)
    return Bmc.model_validate_json(raw) if raw else None


async def record_wipes(conn: asyncpg.Connection, node_id: uuid.UUID, evidence: list[SlotWipe], *,
                       allocation_id: uuid.UUID | None = None, request_id: uuid.UUID | None = None) -> None:
    await conn.executemany(
        "INSERT INTO wipes (node_id, allocation_id, request_id, slot, ok, evidence) VALUES ($1, $2, $3, $4, $5, $6::jsonb)",
        [(node_id, allocation_id, request_id, e.slot, e.ok, json.dumps(e.model_dump(mode="json"))) for e in evidence])
