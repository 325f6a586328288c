"""Stored policies and their versions in the gateway schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import uuid

import asyncpg

COLS = "id, scope, tenant_id, name, description, version, text, enabled, created_by, updated_by, created_at, updated_at"


async def _record_version(conn: asyncpg.Connection, row: asyncpg.Record, by: uuid.UUID, deleted: bool = False) -> None:
    await conn.execute(
        "INSERT INTO policy_versions (policy_id, version, scope, tenant_id, name, description, text, enabled, "
        "deleted, by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)", row["id"], row["version"], row["scope"],
        row["tenant_id"], row["name"], row["description"], row["text"], row["enabled"], deleted, by)


async def insert(conn: asyncpg.Connection, policy: dict, by: uuid.UUID) -> asyncpg.Record:
    """The new policy at version 1 (its first version recorded too)."""
    row = await conn.fetchrow(
        f"INSERT INTO policies (id, scope, tenant_id, name, description, version, text, enabled, created_by, "
        f"updated_by) VALUES ($1, $2, $3, $4, $5, 1, $6, $7, $8, $8) RETURNING {COLS}", policy["id"], policy["scope"],
        policy["tenant_id"], policy["name"], policy["description"], policy["text"], policy["enabled"], by)
    await _record_version(conn, row, by)
    return row


async def get(conn: asyncpg.Connection, policy_id: uuid.UUID, *, lock: bool = False) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {COLS} FROM policies WHERE id=$1{' FOR UPDATE' if lock else ''}", policy_id)


async def replace(conn: asyncpg.Connection, policy_id: uuid.UUID, change: dict, by: uuid.UUID) -> asyncpg.Record:
    """The policy at its next version (the row must be locked by the caller)."""
    row = await conn.fetchrow(
        f"UPDATE policies SET version=version+1, text=$2, enabled=$3, name=$4, description=$5, updated_by=$6, "
        f"updated_at=now() WHERE id=$1 RETURNING {COLS}", policy_id, change["text"], change["enabled"],
        change["name"], change["description"], by)
    await _record_version(conn, row, by)
    return row


async def delete(conn: asyncpg.Connection, row: asyncpg.Record, by: uuid.UUID) -> None:
    """Remove the policy; its versions stay, the last one marked deleted."""
    await conn.execute("DELETE FROM policies WHERE id=$1", row["id"])
    await _record_version(conn, {**dict(row), "version": row["version"] + 1}, by, deleted=True)


async def listed(conn: asyncpg.Connection, *, provider: bool, tenant_id: uuid.UUID | None,
                 every_tenant: bool = False) -> list[asyncpg.Record]:
    """The provider's policies (``provider``) and those of ``tenant_id`` (or of every tenant), oldest first."""
    return await conn.fetch(
        f"SELECT {COLS} FROM policies WHERE ($1 AND scope='provider') OR ($3 AND scope='tenant') "
        "OR tenant_id = $2 ORDER BY created_at, id", provider, tenant_id, every_tenant)


async def versions(conn: asyncpg.Connection, policy_id: uuid.UUID) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT * FROM policy_versions WHERE policy_id=$1 ORDER BY version", policy_id)


async def enabled(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """Every enabled policy, the provider's and all tenants' (what the gateway's cache compiles)."""
    return await conn.fetch(f"SELECT {COLS} FROM policies WHERE enabled ORDER BY created_at, id")
