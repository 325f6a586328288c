"""The image catalog in the gateway schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from .keyset import newest_first

COLS = ("id, name, os, format, source, sha256, min_disk_gb, visibility, tenant_id, kernel, initrd, kernel_args, "
        "is_default, created_at")
# domain.guest.may_see_image in SQL ($1 NULL: a provider admin, who sees all)
_VISIBLE = "($1::uuid IS NULL OR visibility = 'public' OR tenant_id = $1)"


async def insert(conn: asyncpg.Connection, image: dict, created_by: uuid.UUID) -> asyncpg.Record | None:
    """The new image, or None when the name is taken. A default image first takes the mark from the previous
    one (serialised: two new defaults at once end with the later one as the only default)."""
    if image["default"]:
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('gateway.default_image'))")
        if await conn.fetchval("SELECT true FROM images WHERE name=$1", image["name"]):
            return None   # taken: the 409 must not have taken the mark from the current default either
        await conn.execute("UPDATE images SET is_default = false WHERE is_default")
    return await conn.fetchrow(
        f"INSERT INTO images (id, name, os, format, source, sha256, min_disk_gb, visibility, tenant_id, kernel, "
        f"initrd, kernel_args, is_default, created_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, "
        f"$13, $14) ON CONFLICT (name) DO NOTHING RETURNING {COLS}",
        image["id"], image["name"], image["os"], image["format"], image["source"], image["sha256"],
        image["min_disk_gb"], image["visibility"], image.get("tenant_id"), image.get("kernel"), image.get("initrd"),
        image.get("kernel_args"), image["default"], created_by)


async def find(conn: asyncpg.Connection, *, image_id: uuid.UUID | None = None,
               name: str | None = None) -> asyncpg.Record | None:
    """The image with this id (or else this name), whoever may see it (``domain.guest.may_see_image``)."""
    if image_id is not None:
        return await conn.fetchrow(f"SELECT {COLS} FROM images WHERE id=$1", image_id)
    return await conn.fetchrow(f"SELECT {COLS} FROM images WHERE name=$1", name)


async def default(conn: asyncpg.Connection) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {COLS} FROM images WHERE is_default")


async def page(conn: asyncpg.Connection, tenant_id: uuid.UUID | None, limit: int,
               after: tuple[datetime, uuid.UUID] | None) -> list[asyncpg.Record]:
    """Up to ``limit`` images the caller may see, newest first, strictly older than the ``after`` position."""
    return await newest_first(conn, f"SELECT {COLS} FROM images WHERE {_VISIBLE}", [tenant_id], limit, after)


async def delete(conn: asyncpg.Connection, image_id: uuid.UUID) -> asyncpg.Record | None:
    return await conn.fetchrow(f"DELETE FROM images WHERE id=$1 RETURNING {COLS}", image_id)
