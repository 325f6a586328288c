"""Tenants, users and API-key hashes in the gateway schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import uuid

import asyncpg

_USER_COLS = "id, tenant_id, name, role, created_at"
BOOTSTRAP_ADMIN = "admin"


async def create_tenant(conn: asyncpg.Connection, tenant_id: uuid.UUID, name: str,
                        created_by: uuid.UUID) -> asyncpg.Record | None:
    """The new tenant, or None when the name is taken."""
    return await conn.fetchrow(
        "INSERT INTO tenants (id, name, created_by) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING "
        "RETURNING id, name, created_at", tenant_id, name, created_by)


async def list_tenants(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT id, name, created_at FROM tenants ORDER BY created_at, id")


async def tenant_exists(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> bool:
    return bool(await conn.fetchval("SELECT 1 FROM tenants WHERE id=$1", tenant_id))


async def create_user(conn: asyncpg.Connection, user_id: uuid.UUID, tenant_id: uuid.UUID | None, name: str, role: str,
                      created_by: uuid.UUID | None) -> asyncpg.Record | None:
    """The new user, or None when the name is taken in that tenant."""
    return await conn.fetchrow(
        f"INSERT INTO users (id, tenant_id, name, role, created_by) VALUES ($1, $2, $3, $4, $5) "
        f"ON CONFLICT DO NOTHING RETURNING {_USER_COLS}", user_id, tenant_id, name, role, created_by)


async def list_users(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> list[asyncpg.Record]:
    return await conn.fetch(f"SELECT {_USER_COLS} FROM users WHERE tenant_id=$1 ORDER BY created_at, id", tenant_id)


async def add_api_key(conn: asyncpg.Connection, user_id: uuid.UUID, key_hash: str, *, bootstrap: bool = False) -> None:
    await conn.execute("INSERT INTO api_keys (key_hash, user_id, bootstrap) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                       key_hash, user_id, bootstrap)


async def user_for_key(conn: asyncpg.Connection, key_hash: str) -> asyncpg.Record | None:
    """The user a live (not revoked) key belongs to."""
    return await conn.fetchrow(
        "SELECT u.id, u.tenant_id, u.role FROM api_keys k JOIN users u ON u.id = k.user_id "
        "WHERE k.key_hash=$1 AND k.revoked_at IS NULL", key_hash)


async def ensure_bootstrap_admin(conn: asyncpg.Connection, key_hash: str) -> uuid.UUID:
    """Idempotently make the provider admin ``admin`` and give it exactly this bootstrap key.

    Safe for replicas starting together (advisory lock). A bootstrap key that changed
    since the last start replaces the old one, which stops working.
    """
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('gateway.bootstrap_admin'))")
    admin_id = await conn.fetchval("SELECT id FROM users WHERE tenant_id IS NULL AND name=$1", BOOTSTRAP_ADMIN)
    if admin_id is None:
        admin_id = uuid.uuid4()
        await create_user(conn, admin_id, None, BOOTSTRAP_ADMIN, "provider_admin", None)
    await conn.execute("UPDATE api_keys SET revoked_at=now() WHERE user_id=$1 AND bootstrap AND key_hash<>$2 "
                       "AND revoked_at IS NULL", admin_id, key_hash)
    # a key configured again after a rotation becomes valid again
    await conn.execute(
        "INSERT INTO api_keys (key_hash, user_id, bootstrap) VALUES ($1, $2, true) ON CONFLICT (key_hash) "
        "DO UPDATE SET revoked_at = NULL WHERE api_keys.user_id = EXCLUDED.user_id AND api_keys.bootstrap", key_hash, admin_id)
    return admin_id
