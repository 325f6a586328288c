"""Tenants, users, API-key hashes and token signing keys in the gateway schema (asyncpg; the caller owns the
transaction)."""
from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

_USER_COLS = "id, tenant_id, name, role, created_at"
BOOTSTRAP_ADMIN = "admin"


_TENANT_COLS = "id, name, weight, created_at"


async def create_tenant(conn: asyncpg.Connection, tenant_id: uuid.UUID, name: str,
                        created_by: uuid.UUID, weight: int = 1) -> asyncpg.Record | None:
    """The new tenant, or None when the name is taken."""
    return await conn.fetchrow(
        "INSERT INTO tenants (id, name, created_by, weight) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING "
        f"RETURNING {_TENANT_COLS}", tenant_id, name, created_by, weight)


async def list_tenants(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(f"SELECT {_TENANT_COLS} FROM tenants ORDER BY created_at, id")


async def set_tenant_weight(conn: asyncpg.Connection, tenant_id: uuid.UUID, weight: int) -> asyncpg.Record | None:
    """The tenant with its new weight (None: no such tenant)."""
    return await conn.fetchrow(f"UPDATE tenants SET weight=$2 WHERE id=$1 RETURNING {_TENANT_COLS}", tenant_id, weight)


async def tenant_weights(conn: asyncpg.Connection) -> dict[uuid.UUID, int]:
    """Every tenant's weight that is not the default."""
    return {r["id"]: r["weight"] for r in await conn.fetch("SELECT id, weight FROM tenants WHERE weight <> 1")}


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


_KEY_COLS = "id, user_id, name, created_at, expires_at, revoked_at, last_used_at, created_by"


async def add_api_key(conn: asyncpg.Connection, user_id: uuid.UUID, key_hash: str, *, bootstrap: bool = False,
                      name: str = "default", expires_at: datetime | None = None,
                      created_by: uuid.UUID | None = None) -> asyncpg.Record | None:
    """The new key's row (its ``id`` is the first 16 hex digits of the hash), or None for a hash already stored."""
    return await conn.fetchrow(
        f"INSERT INTO api_keys (key_hash, user_id, bootstrap, name, expires_at, created_by) VALUES ($1, $2, $3, $4, "
        f"$5, $6) ON CONFLICT DO NOTHING RETURNING {_KEY_COLS}", key_hash, user_id, bootstrap, name, expires_at,
        created_by)


async def list_api_keys(conn: asyncpg.Connection, user_id: uuid.UUID, limit: int) -> list[asyncpg.Record]:
    """The user's keys, newest first (revoked ones too), at most ``limit``."""
    return await conn.fetch(f"SELECT {_KEY_COLS} FROM api_keys WHERE user_id=$1 ORDER BY created_at DESC, id "
                            f"LIMIT $2", user_id, limit)


async def live_api_keys(conn: asyncpg.Connection, user_id: uuid.UUID) -> int:
    """How many of the user's keys can still obtain a token (not revoked, not expired)."""
    return await conn.fetchval("SELECT count(*) FROM api_keys WHERE user_id=$1 AND revoked_at IS NULL "
                               "AND (expires_at IS NULL OR expires_at > now())", user_id)


async def revoke_api_key(conn: asyncpg.Connection, user_id: uuid.UUID, key_id: str) -> tuple[bool, bool]:
    """(the user has this key, it was revoked just now). Idempotent: a revoked key stays revoked as it was."""
    row = await conn.fetchrow("UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE user_id=$1 AND id=$2 "
                              "RETURNING revoked_at = now() AS now_revoked", user_id, key_id)
    return (row is not None, bool(row and row["now_revoked"]))


async def tenant_user(conn: asyncpg.Connection, tenant_id: uuid.UUID, user_id: uuid.UUID) -> asyncpg.Record | None:
    """The tenant's user (None: no such user in that tenant), with ``disabled_at``."""
    return await conn.fetchrow(f"SELECT {_USER_COLS}, disabled_at FROM users WHERE id=$1 AND tenant_id=$2",
                               user_id, tenant_id)


async def set_user_disabled(conn: asyncpg.Connection, tenant_id: uuid.UUID, user_id: uuid.UUID,
                            disabled: bool) -> tuple[asyncpg.Record | None, bool]:
    """(the user after the change, whether it changed). Disabling stamps ``tokens_not_before``: tokens issued
    before it stay refused once the user is enabled again."""
    changed = await conn.fetchval(
        "UPDATE users SET disabled_at = CASE WHEN $3 THEN now() END, "
        "tokens_not_before = CASE WHEN $3 THEN now() ELSE tokens_not_before END "
        "WHERE id=$1 AND tenant_id=$2 AND (disabled_at IS NOT NULL) <> $3 RETURNING true", user_id, tenant_id, disabled)
    return await tenant_user(conn, tenant_id, user_id), bool(changed)


async def user_for_key(conn: asyncpg.Connection, key_hash: str) -> asyncpg.Record | None:
    """The user a usable key belongs to (the key not revoked nor expired, the user not disabled), with the key's
    ``key_id`` and ``expires_at``; stamps the key's ``last_used_at``."""
    return await conn.fetchrow(
        "UPDATE api_keys k SET last_used_at = now() FROM users u WHERE k.key_hash=$1 AND u.id = k.user_id "
        "AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now()) AND u.disabled_at IS NULL "
        "RETURNING u.id, u.tenant_id, u.role, k.id AS key_id, k.expires_at", key_hash)


# --- what every replica holds in memory (http/credentials.py) -------------------------------------------------

async def recent_revocations(conn: asyncpg.Connection, window_s: float) -> tuple[list[str], list[asyncpg.Record]]:
    """API keys revoked and users disabled (or enabled again) within the last ``window_s`` seconds: older ones
    have no unexpired token left."""
    keys = await conn.fetch("SELECT id FROM api_keys WHERE revoked_at > now() - make_interval(secs => $1)", window_s)
    users = await conn.fetch("SELECT id, disabled_at IS NOT NULL AS disabled, tokens_not_before FROM users "
                             "WHERE tokens_not_before > now() - make_interval(secs => $1)", window_s)
    return [r["id"] for r in keys], list(users)


async def signing_keys(conn: asyncpg.Connection, window_s: float) -> tuple[list[asyncpg.Record], datetime | None]:
    """The current signing key and those retired within ``window_s`` seconds; the first key's creation."""
    rows = await conn.fetch("SELECT kid, created_at, retired_at FROM signing_keys WHERE retired_at IS NULL "
                            "OR retired_at > now() - make_interval(secs => $1) ORDER BY created_at", window_s)
    return list(rows), await conn.fetchval("SELECT min(created_at) FROM signing_keys")


async def current_signing_key(conn: asyncpg.Connection) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT kid, created_at FROM signing_keys WHERE retired_at IS NULL")


async def rotate_signing_key(conn: asyncpg.Connection, kid: str, *, older_than_s: float | None = None) -> bool:
    """Make ``kid`` the current key and retire the one before (in the caller's transaction; replicas rotating
    together take turns on an advisory lock). ``older_than_s``: only if the current key is older than that (or
    there is none); False: nothing done."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('gateway.signing_keys'))")
    if older_than_s is not None:
        young = await conn.fetchval("SELECT 1 FROM signing_keys WHERE retired_at IS NULL "
                                    "AND created_at > now() - make_interval(secs => $1)", older_than_s)
        if young:
            return False
    await conn.execute("UPDATE signing_keys SET retired_at = now() WHERE retired_at IS NULL")
    await conn.execute("INSERT INTO signing_keys (kid) VALUES ($1)", kid)
    return True


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
        "INSERT INTO api_keys (key_hash, user_id, bootstrap, name) VALUES ($1, $2, true, 'bootstrap') "
        "ON CONFLICT (key_hash) DO UPDATE SET revoked_at = NULL "
        "WHERE api_keys.user_id = EXCLUDED.user_id AND api_keys.bootstrap", key_hash, admin_id)
    return admin_id
