"""Shapes, pools and quotas in the scheduler schema (asyncpg; the caller owns the transaction).

Each upsert returns the whole row after the change (its ``version`` bumped), which is what the
``*_changed`` event carries.
"""
from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from .claims import NIL


async def upsert_shape(conn: asyncpg.Connection, s: dict[str, Any]) -> dict[str, Any]:
    row = await conn.fetchrow(
        "INSERT INTO shapes (name, kind, gpu_count, gpu_model, mig_profile, deleted) VALUES ($1,$2,$3,$4,$5,$6) "
        "ON CONFLICT (name) DO UPDATE SET kind=EXCLUDED.kind, gpu_count=EXCLUDED.gpu_count, gpu_model=EXCLUDED.gpu_model, "
        "mig_profile=EXCLUDED.mig_profile, deleted=EXCLUDED.deleted, version=shapes.version + 1 RETURNING *",
        s["name"], s["kind"], s["gpu_count"], s["gpu_model"], s["mig_profile"], s["deleted"])
    return dict(row)


async def shape(conn: asyncpg.Connection, name: str) -> dict[str, Any] | None:
    row = await conn.fetchrow("SELECT * FROM shapes WHERE name=$1 AND NOT deleted", name)
    return dict(row) if row else None


async def all_shapes(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in await conn.fetch("SELECT * FROM shapes WHERE NOT deleted")]


async def every_shape(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Every shape, deleted ones included (running allocations keep theirs)."""
    return [dict(r) for r in await conn.fetch("SELECT * FROM shapes")]


async def upsert_pool(conn: asyncpg.Connection, p: dict[str, Any]) -> dict[str, Any]:
    row = await conn.fetchrow(
        "INSERT INTO pools (name, policy, taints, description) VALUES ($1,$2,$3::jsonb,$4) "
        "ON CONFLICT (name) DO UPDATE SET policy=EXCLUDED.policy, taints=EXCLUDED.taints, "
        "description=EXCLUDED.description, version=pools.version + 1 RETURNING *",
        p["name"], p["policy"], json.dumps(p["taints"]), p["description"])
    return {**dict(row), "taints": json.loads(row["taints"])}


async def all_pools(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [{**dict(r), "taints": json.loads(r["taints"])} for r in await conn.fetch("SELECT * FROM pools")]


async def pool_exists(conn: asyncpg.Connection, name: str) -> bool:
    return bool(await conn.fetchval("SELECT true FROM pools WHERE name=$1", name))


async def set_quota(conn: asyncpg.Connection, tenant_id: uuid.UUID, gpu_model: str, pool: str,
                    user_id: uuid.UUID | None, limit: int, guaranteed: int) -> dict[str, Any]:
    """Set a quota's limit; a new quota starts with ``used`` = what the tenant (or user) already holds,
    so quotas introduced on a running system count running allocations. Never touches allocations."""
    user = user_id or NIL
    row = await conn.fetchrow(
        'INSERT INTO quotas (tenant_id, gpu_model, pool, user_id, "limit", guaranteed, used, published) '
        "SELECT $1, $2, $3, $4, $5, $6, coalesce(sum(gpus), 0), 1 FROM allocations "
        "WHERE tenant_id=$1 AND gpu_model=$2 AND pool=$3 AND ($4 = $7::uuid OR user_id = $4) "
        'ON CONFLICT (tenant_id, gpu_model, pool, user_id) DO UPDATE SET "limit"=EXCLUDED."limit", '
        "guaranteed=EXCLUDED.guaranteed, version=quotas.version + 1, published=quotas.version + 1 RETURNING *",
        tenant_id, gpu_model, pool, user, limit, guaranteed, NIL)
    return dict(row)


async def unpublished_quotas(conn: asyncpg.Connection, limit: int = 1000) -> list[dict[str, Any]]:
    """Quotas whose use changed since their last ``quota_changed``, read without locking them: the claims of
    the scheduler's batches lock quota rows, and must not wait while their documents are built (``mark_published``
    marks them afterwards)."""
    return [dict(r) for r in await conn.fetch("SELECT * FROM quotas WHERE published <> version LIMIT $1", limit)]


async def mark_published(conn: asyncpg.Connection, rows: list[dict[str, Any]]) -> None:
    """Record that ``rows`` (as ``unpublished_quotas`` read them) were sent: each quota's published version rises
    to the one sent. A row a batch holds locked is skipped, not waited for (its use is changing: it is sent
    again next time, and a read model ignores a version it has)."""
    if not rows:
        return
    await conn.execute(
        "UPDATE quotas q SET published = greatest(q.published, d.version) FROM (SELECT l.tenant_id, l.gpu_model, "
        "l.pool, l.user_id, s.version FROM quotas l JOIN unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[], "
        "$5::int[]) AS s(tenant_id, gpu_model, pool, user_id, version) USING (tenant_id, gpu_model, pool, user_id) "
        "FOR UPDATE OF l SKIP LOCKED) d WHERE (q.tenant_id, q.gpu_model, q.pool, q.user_id) = "
        "(d.tenant_id, d.gpu_model, d.pool, d.user_id)",
        *(list(col) for col in zip(*((r["tenant_id"], r["gpu_model"], r["pool"], r["user_id"], r["version"])
                                     for r in rows), strict=True)))


async def all_quotas(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in await conn.fetch("SELECT * FROM quotas")]


def quota_document(row: dict[str, Any]) -> dict[str, Any]:
    """A quota row as the ``scheduler.quota_changed`` payload."""
    return {"tenant_id": row["tenant_id"], "gpu_model": row["gpu_model"], "pool": row["pool"],
            "user_id": None if row["user_id"] == NIL else row["user_id"], "limit": row["limit"],
            "guaranteed": row["guaranteed"], "used": row["used"], "version": row["version"]}
