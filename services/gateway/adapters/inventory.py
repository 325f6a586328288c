"""The scheduler's inventory as the gateway sees it: nodes_view (scheduler columns), shapes_view, pools_view,
quotas_view and admin_rejections (asyncpg; the caller owns the transaction).

Every upsert of a scheduler document is version-guarded: it applies only when the document is
newer than the row, so documents arriving out of order (separate consumers, redelivery) never
move a view backwards. Each returns True when the document was applied.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from services.scheduler.contracts import NodeChanged, PoolChanged, QuotaChanged, ShapeChanged

from ..domain.scheduling import NIL, QuotaRow, ShapeInfo

NODE_COLS = ("id, name, gpu_model, gpu_count, labels, status, pool, region, site, rack, taints, cordoned, proposal, "
             "proposed_slot_map, approved_slot_map, review, free_slots, version, last_rejection, requested_at, "
             "registered_at, changed_at")
_JSON_COLS = ("labels", "taints", "proposed_slot_map", "approved_slot_map", "review", "last_rejection", "tolerations",
              "preemption", "problem")


def plain(row: asyncpg.Record | None) -> dict[str, Any] | None:
    """The row as a dict with its jsonb columns decoded."""
    if row is None:
        return None
    out = dict(row)
    for k in _JSON_COLS:
        if isinstance(out.get(k), str):
            out[k] = json.loads(out[k])
    return out


def _j(value) -> str | None:
    return None if value is None else json.dumps(value)


# --- nodes ---------------------------------------------------------------------------------------

async def apply_node(conn: asyncpg.Connection, d: NodeChanged) -> bool:
    applied = await conn.fetchval(
        "INSERT INTO nodes_view (id, name, gpu_model, gpu_count, labels, status, pool, region, site, rack, taints, "
        "cordoned, proposal, proposed_slot_map, approved_slot_map, review, free_slots, version, registered_at, changed_at) "
        "VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11::jsonb, $12, $13, $14::jsonb, $15::jsonb, $16::jsonb, "
        "$17, $18, now(), now()) ON CONFLICT (id) DO UPDATE SET name=EXCLUDED.name, gpu_model=EXCLUDED.gpu_model, "
        "gpu_count=EXCLUDED.gpu_count, labels=EXCLUDED.labels, status=EXCLUDED.status, pool=EXCLUDED.pool, "
        "region=EXCLUDED.region, site=EXCLUDED.site, rack=EXCLUDED.rack, taints=EXCLUDED.taints, "
        "cordoned=EXCLUDED.cordoned, proposal=EXCLUDED.proposal, proposed_slot_map=EXCLUDED.proposed_slot_map, "
        "approved_slot_map=EXCLUDED.approved_slot_map, review=EXCLUDED.review, free_slots=EXCLUDED.free_slots, "
        "version=EXCLUDED.version, registered_at=coalesce(nodes_view.registered_at, now()), changed_at=now() "
        "WHERE nodes_view.version < EXCLUDED.version RETURNING 1",
        d.node_id, d.name, d.gpu_model, d.gpu_count, _j(d.labels), d.status, d.pool, d.region, d.site, d.rack,
        _j(d.taints), d.cordoned, d.proposal, _j(d.proposed_slot_map), _j(d.approved_slot_map), _j(d.review),
        d.free_slots, d.version)
    return bool(applied)


async def mark_registered(conn: asyncpg.Connection, node_id: uuid.UUID, name: str, gpu_model: str, gpu_count: int) -> None:
    """Idempotent: the scheduler confirmed the node. Only a node without a scheduler document yet
    (version 0) shows 'registered'; a late confirmation never overwrites a newer document's status."""
    await conn.execute(
        "INSERT INTO nodes_view (id, name, gpu_model, gpu_count, status, registered_at) "
        "VALUES ($1, $2, $3, $4, 'registered', now()) ON CONFLICT DO NOTHING", node_id, name, gpu_model, gpu_count)
    await conn.execute(
        "UPDATE nodes_view SET status='registered', gpu_model=$2, gpu_count=$3, registered_at=coalesce(registered_at, now()) "
        "WHERE id=$1 AND version = 0", node_id, gpu_model, gpu_count)


async def get_node(conn: asyncpg.Connection, node_id: uuid.UUID, *, for_update: bool = False) -> dict | None:
    lock = " FOR UPDATE" if for_update else ""
    return plain(await conn.fetchrow(f"SELECT {NODE_COLS} FROM nodes_view WHERE id=$1{lock}", node_id))


async def pool_models(conn: asyncpg.Connection, pool: str) -> list[str]:
    """The GPU models of the nodes the scheduler placed in ``pool``."""
    rows = await conn.fetch("SELECT DISTINCT gpu_model FROM nodes_view WHERE pool=$1 AND version > 0", pool)
    return [r["gpu_model"] for r in rows]


# --- shapes and pools ----------------------------------------------------------------------------

async def apply_shape(conn: asyncpg.Connection, d: ShapeChanged) -> bool:
    return bool(await conn.fetchval(
        "INSERT INTO shapes_view (name, kind, gpu_count, gpu_model, mig_profile, deleted, version) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO UPDATE SET kind=EXCLUDED.kind, "
        "gpu_count=EXCLUDED.gpu_count, gpu_model=EXCLUDED.gpu_model, mig_profile=EXCLUDED.mig_profile, "
        "deleted=EXCLUDED.deleted, version=EXCLUDED.version, changed_at=now() "
        "WHERE shapes_view.version < EXCLUDED.version RETURNING 1",
        d.name, d.kind, d.gpu_count, d.gpu_model, d.mig_profile, d.deleted, d.version))


async def shapes(conn: asyncpg.Connection) -> list[ShapeInfo]:
    """Every shape document, deleted ones included."""
    rows = await conn.fetch("SELECT name, kind, gpu_count, gpu_model, mig_profile, deleted, version FROM shapes_view")
    return [ShapeInfo(**dict(r)) for r in rows]


async def shape_rejections(conn: asyncpg.Connection) -> dict[str, dict]:
    """shape name -> the scheduler's last refusal of a command about it."""
    rows = await conn.fetch("SELECT name, last_rejection FROM shapes_view WHERE last_rejection IS NOT NULL")
    return {r["name"]: plain(r)["last_rejection"] for r in rows}


async def apply_pool(conn: asyncpg.Connection, d: PoolChanged) -> bool:
    return bool(await conn.fetchval(
        "INSERT INTO pools_view (name, policy, taints, description, version) VALUES ($1, $2, $3::jsonb, $4, $5) "
        "ON CONFLICT (name) DO UPDATE SET policy=EXCLUDED.policy, taints=EXCLUDED.taints, "
        "description=EXCLUDED.description, version=EXCLUDED.version, changed_at=now() "
        "WHERE pools_view.version < EXCLUDED.version RETURNING 1",
        d.name, d.policy, _j(d.taints), d.description, d.version))


_POOL_COLS = "name, policy, taints, description, version, last_rejection, changed_at"


async def pools(conn: asyncpg.Connection) -> list[dict]:
    return [plain(r) for r in await conn.fetch(f"SELECT {_POOL_COLS} FROM pools_view ORDER BY name")]


async def get_pool(conn: asyncpg.Connection, name: str) -> dict | None:
    return plain(await conn.fetchrow(f"SELECT {_POOL_COLS} FROM pools_view WHERE name=$1", name))


# --- quotas --------------------------------------------------------------------------------------

async def apply_quota(conn: asyncpg.Connection, d: QuotaChanged) -> bool:
    return bool(await conn.fetchval(
        'INSERT INTO quotas_view (tenant_id, gpu_model, pool, user_id, "limit", guaranteed, used, version) '
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (tenant_id, gpu_model, pool, user_id) DO UPDATE SET "
        '"limit"=EXCLUDED."limit", guaranteed=EXCLUDED.guaranteed, used=EXCLUDED.used, version=EXCLUDED.version, '
        "changed_at=now() WHERE quotas_view.version < EXCLUDED.version RETURNING 1",
        d.tenant_id, d.gpu_model, d.pool, d.user_id or NIL, d.limit, d.guaranteed, d.used, d.version))


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


async def quota_rows(conn: asyncpg.Connection, tenant_id: uuid.UUID, pool: str, user_id: uuid.UUID) -> list[QuotaRow]:
    """The tenant's own quotas in ``pool`` and the user's splits there (what one request is charged against)."""
    rows = await conn.fetch('SELECT gpu_model, user_id, "limit", used FROM quotas_view WHERE tenant_id=$1 AND pool=$2 '
                            "AND user_id = ANY($3::uuid[])", tenant_id, pool, [NIL, user_id])
    return [QuotaRow(r["gpu_model"], r["user_id"], r["limit"], r["used"]) for r in rows]


async def user_in_tenant(conn: asyncpg.Connection, user_id: uuid.UUID, tenant_id: uuid.UUID) -> bool:
    return bool(await conn.fetchval("SELECT 1 FROM users WHERE id=$1 AND tenant_id=$2", user_id, tenant_id))


# --- rejections ----------------------------------------------------------------------------------

async def record_rejection(conn: asyncpg.Connection, event_id: uuid.UUID, command: str, target: str, reason: str) -> None:
    """Keep the rejection and show it on its target (a node id, a shape or a pool name) when one matches."""
    await conn.execute("INSERT INTO admin_rejections (event_id, command, target, reason) VALUES ($1, $2, $3, $4) "
                       "ON CONFLICT DO NOTHING", event_id, command, target, reason)
    doc = json.dumps({"command": command, "reason": reason, "event_id": str(event_id)})
    try:
        node_id = uuid.UUID(target)
    except ValueError:
        node_id = None
    if node_id is not None:
        await conn.execute("UPDATE nodes_view SET last_rejection = $2::jsonb || jsonb_build_object('at', now()) "
                           "WHERE id=$1", node_id, doc)
        return
    for table in ("shapes_view", "pools_view"):
        await conn.execute(f"UPDATE {table} SET last_rejection = $2::jsonb || jsonb_build_object('at', now()) "
                           "WHERE name=$1", target, doc)
