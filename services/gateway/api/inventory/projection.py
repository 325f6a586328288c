"""The scheduler's inventory documents into their views: nodes_view (with the scheduler's registration
confirmation; the node's quarantined slots and its last burn-in run too), shapes_view, pools_view and quotas_view.

Each handler runs in the consumer's transaction (inbox dedupe included). Every upsert of a
scheduler document is version-guarded: it applies only when the document is newer than the row,
so documents arriving out of order (separate consumers, redelivery) never move a view backwards;
each upsert returns True when the document was applied.

A node's free slots follow their own order (node_capacity_view): every message that takes or frees slots
(slots_reserved, slots_released; the node document too) carries the node's free-slot count with the
node's capacity sequence, and a count is applied only when its seq is newer than the one shown
(``apply_capacity``). The document's version does not order them: slots taken and freed do not change it.
"""
from __future__ import annotations

import json
import uuid

import asyncpg
import structlog

from services.scheduler import contracts as sc
from shared.unit_of_work import UnitOfWork

from ...adapters.inventory import apply_capacity
from ...adapters.versioned import upsert_newer
from ...domain.scheduling import NIL

log = structlog.get_logger()


def _j(value) -> str | None:
    return None if value is None else json.dumps(value)


async def apply_node(conn: asyncpg.Connection, d: sc.NodeChanged) -> bool:
    quarantined = [q.model_dump(mode="json") for q in d.quarantined]
    burn_in = d.burn_in.model_dump(mode="json") if d.burn_in is not None else None
    applied = await conn.fetchval(
        "INSERT INTO nodes_view (id, name, gpu_model, gpu_count, labels, status, pool, region, site, rack, taints, "
        "cordoned, proposal, proposed_slot_map, approved_slot_map, review, free_slots, version, quarantined, burn_in, "
        "registered_at, changed_at) "
        "VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11::jsonb, $12, $13, $14::jsonb, $15::jsonb, $16::jsonb, "
        "$17, $18, $19::jsonb, $20::jsonb, now(), now()) ON CONFLICT (id) DO UPDATE SET name=EXCLUDED.name, "
        "gpu_model=EXCLUDED.gpu_model, "
        "gpu_count=EXCLUDED.gpu_count, labels=EXCLUDED.labels, status=EXCLUDED.status, pool=EXCLUDED.pool, "
        "region=EXCLUDED.region, site=EXCLUDED.site, rack=EXCLUDED.rack, taints=EXCLUDED.taints, "
        "cordoned=EXCLUDED.cordoned, proposal=EXCLUDED.proposal, proposed_slot_map=EXCLUDED.proposed_slot_map, "
        "approved_slot_map=EXCLUDED.approved_slot_map, review=EXCLUDED.review, free_slots=EXCLUDED.free_slots, "
        "version=EXCLUDED.version, quarantined=EXCLUDED.quarantined, burn_in=EXCLUDED.burn_in, "
        "registered_at=coalesce(nodes_view.registered_at, now()), changed_at=now() "
        "WHERE nodes_view.version < EXCLUDED.version RETURNING 1",
        d.node_id, d.name, d.gpu_model, d.gpu_count, _j(d.labels), d.status, d.pool, d.region, d.site, d.rack,
        _j(d.taints), d.cordoned, d.proposal, _j(d.proposed_slot_map), _j(d.approved_slot_map), _j(d.review),
        d.free_slots, d.version, _j(quarantined), _j(burn_in))
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


_CHANGED_NOW = {"changed_at": "now()"}
_SHAPE = upsert_newer("shapes_view", ["name"], ["name", "kind", "gpu_count", "gpu_model", "mig_profile", "deleted",
                                                "version"], assign=_CHANGED_NOW, returning=True)
_POOL = upsert_newer("pools_view", ["name"], ["name", "policy", "taints", "description", "version"], jsonb={"taints"},
                     assign=_CHANGED_NOW, returning=True)
_QUOTA_KEY = ["tenant_id", "gpu_model", "pool", "user_id"]
_QUOTA_COLUMNS = [*_QUOTA_KEY, '"limit"', "guaranteed", "used", "version"]
_QUOTA = upsert_newer("quotas_view", _QUOTA_KEY, _QUOTA_COLUMNS, assign=_CHANGED_NOW, returning=True)
_QUOTAS = upsert_newer("quotas_view", _QUOTA_KEY, _QUOTA_COLUMNS, assign=_CHANGED_NOW, returning=True,
                       arrays=["uuid", "text", "text", "uuid", "int", "int", "int", "int"])


async def apply_shape(conn: asyncpg.Connection, d: sc.ShapeChanged) -> bool:
    return bool(await conn.fetchval(_SHAPE, d.name, d.kind, d.gpu_count, d.gpu_model, d.mig_profile, d.deleted,
                                    d.version))


async def apply_pool(conn: asyncpg.Connection, d: sc.PoolChanged) -> bool:
    return bool(await conn.fetchval(_POOL, d.name, d.policy, _j(d.taints), d.description, d.version))


async def apply_quota(conn: asyncpg.Connection, d: sc.QuotaChanged) -> bool:
    return bool(await conn.fetchval(_QUOTA, d.tenant_id, d.gpu_model, d.pool, d.user_id or NIL, d.limit, d.guaranteed,
                                    d.used, d.version))


async def apply_quotas(conn: asyncpg.Connection, docs: list[sc.QuotaChanged]) -> int:
    """``apply_quota`` for many documents in one round trip; returns how many were applied. A key given twice
    keeps its newest document (one statement may not change a row twice)."""
    newest: dict[tuple, sc.QuotaChanged] = {}
    for d in docs:
        key = (d.tenant_id, d.gpu_model, d.pool, d.user_id or NIL)
        if key not in newest or newest[key].version < d.version:
            newest[key] = d
    rows = [(*key, d.limit, d.guaranteed, d.used, d.version) for key, d in newest.items()]
    if not rows:
        return 0
    return len(await conn.fetch(_QUOTAS, *(list(col) for col in zip(*rows, strict=True))))


async def on_node_registered(ctx: UnitOfWork, data: sc.NodeRegistered) -> None:
    # the scheduler-aware variant: a late confirmation never overwrites a newer node_changed document
    await mark_registered(ctx.conn, data.node_id, data.name, data.gpu_model, data.gpu_count)


async def on_node_changed(ctx: UnitOfWork, data: sc.NodeChanged) -> None:
    if not await apply_node(ctx.conn, data):
        log.info("projection.stale_document_ignored", kind="node", id=str(data.node_id), version=data.version)
    await apply_capacity(ctx.conn, data.node_id, data.capacity)   # ordered by its own seq, not by the version


async def on_slots_released(ctx: UnitOfWork, data: sc.SlotsReleased) -> None:
    """Only the node's free slots: the allocation view follows the allocation's own release events."""
    if data.node_id is not None:
        await apply_capacity(ctx.conn, data.node_id, data.capacity)


async def on_shape_changed(ctx: UnitOfWork, data: sc.ShapeChanged) -> None:
    if not await apply_shape(ctx.conn, data):
        log.info("projection.stale_document_ignored", kind="shape", id=data.name, version=data.version)


async def on_pool_changed(ctx: UnitOfWork, data: sc.PoolChanged) -> None:
    if not await apply_pool(ctx.conn, data):
        log.info("projection.stale_document_ignored", kind="pool", id=data.name, version=data.version)


async def on_quota_changed(ctx: UnitOfWork, data: sc.QuotaChanged) -> None:
    if not await apply_quota(ctx.conn, data):
        log.info("projection.stale_document_ignored", kind="quota", id=str(data.tenant_id), version=data.version)


async def on_quota_use_changed(ctx: UnitOfWork, data: sc.QuotaUseChanged) -> None:
    """Many quotas' documents in one statement, each under the same version guard as ``quota_changed``."""
    await apply_quotas(ctx.conn, data.quotas)
