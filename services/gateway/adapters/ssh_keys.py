"""Users' SSH public keys in the gateway schema (asyncpg; the caller owns the transaction)."""
from __future__ import annotations

import uuid

import asyncpg

_KEY_COLS = "name, key_type, public_key, fingerprint, created_at"


async def lock_keys_of(conn: asyncpg.Connection, user_id: uuid.UUID) -> None:
    """Serialise changes to one user's keys until commit (the count limit holds under concurrency)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 11))", str(user_id))


async def count(conn: asyncpg.Connection, user_id: uuid.UUID) -> int:
    return await conn.fetchval("SELECT count(*) FROM ssh_keys WHERE user_id=$1", user_id)


async def add(conn: asyncpg.Connection, user_id: uuid.UUID, name: str, key_type: str, public_key: str,
                  fingerprint: str) -> asyncpg.Record | None:
    """The new key, or None when the user already has a key of that name."""
    return await conn.fetchrow(
        f"INSERT INTO ssh_keys (user_id, name, key_type, public_key, fingerprint) VALUES ($1, $2, $3, $4, $5) "
        f"ON CONFLICT DO NOTHING RETURNING {_KEY_COLS}", user_id, name, key_type, public_key, fingerprint)


async def keys_of(conn: asyncpg.Connection, user_id: uuid.UUID, names: list[str] | None = None) -> list[asyncpg.Record]:
    """The user's keys by name (only those named, when ``names`` is given)."""
    if names is None:
        return await conn.fetch(f"SELECT {_KEY_COLS} FROM ssh_keys WHERE user_id=$1 ORDER BY name", user_id)
    return await conn.fetch(f"SELECT {_KEY_COLS} FROM ssh_keys WHERE user_id=$1 AND name = ANY($2::text[]) "
                            "ORDER BY name", user_id, names)


async def delete(conn: asyncpg.Connection, user_id: uuid.UUID, name: str) -> bool:
    return await conn.fetchval("DELETE FROM ssh_keys WHERE user_id=$1 AND name=$2 RETURNING 1", user_id, name) is not None
