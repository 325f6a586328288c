"""volumes_view, volume_quotas_view and storage_classes_view as the HTTP handlers read and request them (asyncpg;
the caller owns the transaction). The projection applies the storage service's events (``api/storage/projection.py``).

Every read of a volume takes the caller's tenant: another tenant's volume is simply not found.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime

import asyncpg

from shared.db import in_list

from ..domain.scheduling import NIL
from ..domain.volumes import ENDED_ALLOCATION, LIVE, NO_OFFER, Offer, StorageClass, Use
from .keyset import newest_first

_LIVE = in_list(LIVE)   # written in: the partial index volumes_view_live holds only these (shared.db.in_list)

VOL_COLS = ("id, tenant_id, user_id, name, storage_class, backend, size_bytes, pending_size_bytes, used_bytes, shared, "
            "scratch, state, reason, attachments, version, created_at, updated_at")
QUOTA_COLS = "tenant_id, storage_class, user_id, max_bytes, max_volumes, version"
# what a volume holds against its quota: its size, or the larger size a pending resize asked for
_HELD = "greatest(size_bytes, coalesce(pending_size_bytes, 0))"


def attachments_of(row: asyncpg.Record | dict) -> list[dict]:
    value = row["attachments"]
    return json.loads(value) if isinstance(value, str) else list(value or [])


# --- volumes -------------------------------------------------------------------------------------

async def lock_tenant(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> None:
    """Serialise the tenant's volume creations until commit (a live volume's name is unique in its tenant)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 13))", f"volumes:{tenant_id}")


async def live_named(conn: asyncpg.Connection, tenant_id: uuid.UUID, name: str) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT id FROM volumes_view WHERE tenant_id=$1 AND name=$2 AND state IN {_LIVE} LIMIT 1",
                               tenant_id, name)


async def request_volume(conn: asyncpg.Connection, volume_id: uuid.UUID, tenant_id: uuid.UUID, user_id: uuid.UUID,
                         name: str, storage_class: str, backend: str, size_bytes: int, shared: bool) -> asyncpg.Record:
    """The new 'creating' row (version 0: no document yet)."""
    return await conn.fetchrow(
        f"INSERT INTO volumes_view (id, tenant_id, user_id, name, storage_class, backend, size_bytes, shared, state) "
        f"VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'creating') RETURNING {VOL_COLS}",
        volume_id, tenant_id, user_id, name, storage_class, backend, size_bytes, shared)


async def get(conn: asyncpg.Connection, volume_id: uuid.UUID, tenant_id: uuid.UUID, *,
              for_update: bool = False) -> asyncpg.Record | None:
    """The tenant's volume, unless it was deleted."""
    lock = " FOR UPDATE" if for_update else ""
    return await conn.fetchrow(f"SELECT {VOL_COLS} FROM volumes_view WHERE id=$1 AND tenant_id=$2 "
                               f"AND state <> 'deleted'{lock}", volume_id, tenant_id)


async def of_tenant(conn: asyncpg.Connection, tenant_id: uuid.UUID, ids: list[uuid.UUID]) -> dict[uuid.UUID, asyncpg.Record]:
    rows = await conn.fetch(f"SELECT {VOL_COLS} FROM volumes_view WHERE tenant_id=$1 AND id = ANY($2::uuid[]) "
                            f"AND state <> 'deleted'", tenant_id, ids)
    return {r["id"]: r for r in rows}


async def page(conn: asyncpg.Connection, tenant_id: uuid.UUID, limit: int,
               after: tuple[datetime, uuid.UUID] | None) -> list[asyncpg.Record]:
    """Up to ``limit`` of the tenant's volumes (deleted ones left out), newest first, older than ``after``."""
    return await newest_first(conn, f"SELECT {VOL_COLS} FROM volumes_view WHERE tenant_id=$1 AND state <> 'deleted'",
                              [tenant_id], limit, after)


async def set_state(conn: asyncpg.Connection, volume_id: uuid.UUID, state: str) -> asyncpg.Record:
    return await conn.fetchrow(f"UPDATE volumes_view SET state=$2, updated_at=now() WHERE id=$1 RETURNING {VOL_COLS}",
                               volume_id, state)


async def request_resize(conn: asyncpg.Connection, volume_id: uuid.UUID, size_bytes: int) -> asyncpg.Record:
    """Hold the larger size against the quota until a newer document of the volume arrives."""
    return await conn.fetchrow(
        f"UPDATE volumes_view SET pending_size_bytes = greatest(coalesce(pending_size_bytes, 0), $2), "
        f"updated_at=now() WHERE id=$1 RETURNING {VOL_COLS}", volume_id, size_bytes)


async def set_attachments(conn: asyncpg.Connection, volume_id: uuid.UUID, attachments: list[dict]) -> asyncpg.Record:
    return await conn.fetchrow(f"UPDATE volumes_view SET attachments=$2::jsonb, updated_at=now() WHERE id=$1 "
                               f"RETURNING {VOL_COLS}", volume_id, json.dumps(attachments, default=str))


async def live_allocations_naming(conn: asyncpg.Connection, tenant_id: uuid.UUID, volume_id: uuid.UUID) -> list[uuid.UUID]:
    """The tenant's allocations that asked to mount the volume and have not ended (RELEASED or FAILED)."""
    rows = await conn.fetch("SELECT id FROM allocations_view WHERE tenant_id=$1 AND volumes @> $2::jsonb "
                            "AND state <> ALL($3)", tenant_id, json.dumps([{"volume_id": str(volume_id)}]),
                            list(ENDED_ALLOCATION))
    return [r["id"] for r in rows]


async def allocation_address(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> str | None:
    """The allocation's address on its tenant network (the client a volume's export allows), if attached."""
    return await conn.fetchval("SELECT host(ip_address) FROM network_attachments_view WHERE allocation_id=$1 "
                               "AND detached_at IS NULL", allocation_id)


# --- storage classes -----------------------------------------------------------------------------

def _offer(row: asyncpg.Record | None) -> Offer:
    if row is None:
        return NO_OFFER
    classes = row["classes"] if not isinstance(row["classes"], str) else json.loads(row["classes"])
    known = StorageClass.__dataclass_fields__
    return Offer(tuple(StorageClass(**{k: v for k, v in c.items() if k in known}) for c in classes),
                 row["default_quota_bytes"], row["default_quota_volumes"])


async def offer(conn: asyncpg.Connection) -> Offer:
    """The classes last announced (none yet: an empty offer without defaults)."""
    return _offer(await conn.fetchrow("SELECT classes, default_quota_bytes, default_quota_volumes "
                                      "FROM storage_classes_view WHERE id=1"))


# --- quotas --------------------------------------------------------------------------------------

async def lock_quotas(conn: asyncpg.Connection, tenant_id: uuid.UUID, storage_class: str,
                      user_id: uuid.UUID) -> tuple[asyncpg.Record, asyncpg.Record]:
    """The tenant's and the user's quota rows of the class, locked until commit (placeholders inserted when none
    exists, so there is always a row to lock): every request that adds to the class's use takes them first,
    tenant row before user row."""
    await conn.execute("INSERT INTO volume_quotas_view (tenant_id, storage_class, user_id) VALUES ($1, $2, $3), "
                       "($1, $2, $4) ON CONFLICT DO NOTHING", tenant_id, storage_class, NIL, user_id)
    lock = (f"SELECT {QUOTA_COLS} FROM volume_quotas_view WHERE tenant_id=$1 AND storage_class=$2 AND user_id=$3 "
            "FOR UPDATE")
    return await conn.fetchrow(lock, tenant_id, storage_class, NIL), await conn.fetchrow(lock, tenant_id, storage_class,
                                                                                        user_id)


async def quota_row(conn: asyncpg.Connection, tenant_id: uuid.UUID, storage_class: str,
                    user_id: uuid.UUID = NIL) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {QUOTA_COLS} FROM volume_quotas_view WHERE tenant_id=$1 AND storage_class=$2 "
                               "AND user_id=$3", tenant_id, storage_class, user_id)


async def use_of(conn: asyncpg.Connection, tenant_id: uuid.UUID, storage_class: str,
                 user_id: uuid.UUID | None = None) -> Use:
    """What the tenant's (or one user's) live volumes of the class hold: bytes (sizes, pending resizes included)
    and how many, scratch volumes included."""
    row = await conn.fetchrow(
        f"SELECT coalesce(sum({_HELD}), 0) AS bytes, count(*) AS volumes FROM volumes_view "
        f"WHERE tenant_id=$1 AND storage_class=$2 AND state IN {_LIVE} AND ($3::uuid IS NULL OR user_id=$3)",
        tenant_id, storage_class, user_id)
    return Use(int(row["bytes"]), row["volumes"])   # a numeric sum: never a bigint overflow


async def quotas_of(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> list[asyncpg.Record]:
    """The tenant's quota rows that something was set in (placeholders left out), by class then user."""
    return await conn.fetch(f"SELECT {QUOTA_COLS} FROM volume_quotas_view WHERE tenant_id=$1 AND version > 0 "
                            "ORDER BY storage_class, user_id", tenant_id)


async def usage_by_class(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> list[dict]:
    """Per class and user of the tenant's live volumes: bytes held, how many, and what the storage systems count."""
    rows = await conn.fetch(
        f"SELECT storage_class, user_id, coalesce(sum({_HELD}), 0) AS provisioned_bytes, count(*) AS volumes, "
        f"coalesce(sum(used_bytes), 0) AS used_bytes FROM volumes_view WHERE tenant_id=$1 AND state IN {_LIVE} "
        "GROUP BY storage_class, user_id", tenant_id)
    return [{**dict(r), "provisioned_bytes": int(r["provisioned_bytes"]), "used_bytes": int(r["used_bytes"])}
            for r in rows]
