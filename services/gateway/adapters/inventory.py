"""The scheduler's inventory as the HTTP handlers read it: nodes_view (scheduler columns), shapes_view, pools_view
and quotas_view (asyncpg; the caller owns the transaction). The inventory slice's projection writes them
(api/inventory/projection.py; the free slots also from the allocations slice's: ``apply_capacity``).
"""
from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from services.scheduler import contracts as sc

from ..domain.scheduling import NIL, QuotaRow, ShapeInfo

_NODE_VIEW_COLS = ("id, name, gpu_model, gpu_count, labels, status, pool, region, site, rack, taints, cordoned, "
                   "proposal, proposed_slot_map, approved_slot_map, review, version, last_rejection, requested_at, "
                   "registered_at, changed_at, quarantined, burn_in")
# free_slots: the newest count (node_capacity_view) while the document says schedulable, else 0; the
# document's own free_slots only when no count was ever carried (documents of an older scheduler)
NODE_COLS = (", ".join(f"n.{c.strip()}" for c in _NODE_VIEW_COLS.split(",")) +
             ", CASE WHEN c.node_id IS NULL THEN n.free_slots WHEN n.status = 'schedulable' THEN c.free_slots "
             "ELSE 0 END AS free_slots, coalesce(c.seq, 0) AS capacity_version, "
             # the node's BMC as the document shows it: never its password, sealed or not
             "CASE WHEN b.url IS NULL THEN NULL ELSE jsonb_build_object('url', b.url, 'system_id', b.system_id, "
             "'username', b.username, 'password_set', true) END AS bmc")
_JSON_COLS = ("labels", "taints", "proposed_slot_map", "approved_slot_map", "review", "last_rejection", "tolerations",
              "preemption", "problem", "instance", "quarantined", "burn_in", "bmc", "volumes", "interruption")


def plain(row: asyncpg.Record | None) -> dict[str, Any] | None:
    """The row as a dict with its jsonb columns decoded."""
    if row is None:
        return None
    out = dict(row)
    for k in _JSON_COLS:
        if isinstance(out.get(k), str):
            out[k] = json.loads(out[k])
    return out


# --- nodes ---------------------------------------------------------------------------------------

async def get_node(conn: asyncpg.Connection, node_id: uuid.UUID, *, for_update: bool = False) -> dict | None:
    """The node's document with its newest free-slot count and its BMC (``for_update`` locks the nodes_view row)."""
    lock = " FOR UPDATE OF n" if for_update else ""
    return plain(await conn.fetchrow(f"SELECT {NODE_COLS} FROM nodes_view n LEFT JOIN node_capacity_view c "
                                     f"ON c.node_id = n.id LEFT JOIN node_bmcs b ON b.node_id = n.id "
                                     f"WHERE n.id=$1{lock}", node_id))


# --- shapes and pools ----------------------------------------------------------------------------

async def shapes(conn: asyncpg.Connection) -> list[ShapeInfo]:
    """Every shape document, deleted ones included."""
    rows = await conn.fetch("SELECT name, kind, gpu_count, gpu_model, mig_profile, deleted, version FROM shapes_view")
    return [ShapeInfo(**dict(r)) for r in rows]


async def shape_users(conn: asyncpg.Connection, name: str) -> int:
    """How many live allocations (not RELEASED or FAILED) of any tenant ask for shape ``name``."""
    return await conn.fetchval("SELECT count(*) FROM allocations_view WHERE shape=$1 AND state NOT IN "
                               "('RELEASED', 'FAILED')", name)


async def shape_rejections(conn: asyncpg.Connection) -> dict[str, dict]:
    """shape name -> the scheduler's last refusal of a command about it."""
    rows = await conn.fetch("SELECT name, last_rejection FROM shapes_view WHERE last_rejection IS NOT NULL")
    return {r["name"]: plain(r)["last_rejection"] for r in rows}


_POOL_COLS = "name, policy, taints, description, version, last_rejection, changed_at"


async def pools(conn: asyncpg.Connection) -> list[dict]:
    return [plain(r) for r in await conn.fetch(f"SELECT {_POOL_COLS} FROM pools_view ORDER BY name")]


async def get_pool(conn: asyncpg.Connection, name: str) -> dict | None:
    return plain(await conn.fetchrow(f"SELECT {_POOL_COLS} FROM pools_view WHERE name=$1", name))


# --- quotas --------------------------------------------------------------------------------------

_QUOTA_COLS = 'tenant_id, gpu_model, pool, user_id, "limit", guaranteed, used, version, changed_at'


async def tenant_quotas(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> list[dict]:
    """Every quota row of the tenant (its own and its users' splits), by pool, model, then user."""
    rows = await conn.fetch(f"SELECT {_QUOTA_COLS} FROM quotas_view WHERE tenant_id=$1 "
                            "ORDER BY pool, gpu_model, user_id", tenant_id)
    return [dict(r) for r in rows]


async def get_quota(conn: asyncpg.Connection, tenant_id: uuid.UUID, pool: str, gpu_model: str,
                    user_id: uuid.UUID = NIL) -> dict | None:
    row = await conn.fetchrow(f"SELECT {_QUOTA_COLS} FROM quotas_view WHERE tenant_id=$1 AND pool=$2 AND gpu_model=$3 "
                              "AND user_id=$4", tenant_id, pool, gpu_model, user_id)
    return dict(row) if row else None


# the GPU models of the pool's nodes, one probe of nodes_view_pool_model per model (a loose index scan): a DISTINCT
# read every node of the pool, on every request, thousands of index entries in a large pool
_POOL_MODELS = (
    "ARRAY(WITH RECURSIVE m AS ((SELECT gpu_model FROM nodes_view WHERE pool=$2 AND version > 0 ORDER BY gpu_model "
    "LIMIT 1) UNION ALL SELECT (SELECT n.gpu_model FROM nodes_view n WHERE n.pool=$2 AND n.version > 0 "
    "AND n.gpu_model > m.gpu_model ORDER BY n.gpu_model LIMIT 1) FROM m WHERE m.gpu_model IS NOT NULL) "
    "SELECT gpu_model FROM m WHERE gpu_model IS NOT NULL)")


async def quota_rows(conn: asyncpg.Connection, tenant_id: uuid.UUID, pool: str, user_id: uuid.UUID, *,
                     pool_models: bool) -> tuple[list[QuotaRow], list[str]]:
    """The tenant's own quotas in ``pool`` and the user's splits there (what one request is charged against), and,
    when ``pool_models`` and there is any such quota, the GPU models of the nodes the scheduler placed in the pool.
    One round trip: the models are an uncorrelated subquery, read once and only when a quota row is found."""
    rows = await conn.fetch(
        f'SELECT gpu_model, user_id, "limit", used, CASE WHEN $4 THEN {_POOL_MODELS} END AS pool_models '
        "FROM quotas_view WHERE tenant_id=$1 AND pool=$2 AND user_id = ANY($3::uuid[])",
        tenant_id, pool, [NIL, user_id], pool_models)
    models = list(rows[0]["pool_models"] or []) if rows else []
    return [QuotaRow(r["gpu_model"], r["user_id"], r["limit"], r["used"]) for r in rows], models


async def user_in_tenant(conn: asyncpg.Connection, user_id: uuid.UUID, tenant_id: uuid.UUID) -> bool:
    return bool(await conn.fetchval("SELECT 1 FROM users WHERE id=$1 AND tenant_id=$2", user_id, tenant_id))


async def apply_capacity(conn: asyncpg.Connection, node_id: uuid.UUID, capacity: sc.NodeCapacity | None) -> bool:
    """Show the node's free-slot count if it is newer (a higher capacity seq) than the one shown; True when
    applied. Needs no node document yet: a count may overtake the node's first document."""
    if capacity is None:          # a message from before counts were carried
        return False
    return bool(await conn.fetchval(
        "INSERT INTO node_capacity_view (node_id, free_slots, seq) VALUES ($1, $2, $3) ON CONFLICT (node_id) DO "
        "UPDATE SET free_slots=EXCLUDED.free_slots, seq=EXCLUDED.seq, changed_at=now() "
        "WHERE node_capacity_view.seq < EXCLUDED.seq RETURNING 1", node_id, capacity.free_slots, capacity.seq))
