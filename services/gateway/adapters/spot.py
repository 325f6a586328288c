"""Spot offerings as the gateway shows them (spot_offerings_view), and what a provider admin may name in one."""
from __future__ import annotations

import json

import asyncpg


async def offerings(conn: asyncpg.Connection) -> list[dict]:
    return [json.loads(r["doc"]) for r in await conn.fetch("SELECT doc FROM spot_offerings_view ORDER BY pool")]


async def offering(conn: asyncpg.Connection, pool: str) -> dict | None:
    raw = await conn.fetchval("SELECT doc FROM spot_offerings_view WHERE pool=$1", pool)
    return json.loads(raw) if raw is not None else None


async def store_newer(conn: asyncpg.Connection, pool: str, doc: str, version: int) -> None:
    """Keep the document when it is newer than the one shown (documents may arrive out of order)."""
    await conn.execute(
        "INSERT INTO spot_offerings_view (pool, doc, version) VALUES ($1, $2, $3) ON CONFLICT (pool) DO UPDATE "
        "SET doc=EXCLUDED.doc, version=EXCLUDED.version WHERE spot_offerings_view.version < EXCLUDED.version",
        pool, doc, version)


async def pool_known(conn: asyncpg.Connection, pool: str) -> bool:
    """A pool the provider defined, or one a node is in (the shared pool needs no definition)."""
    return bool(await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pools_view WHERE name=$1) OR EXISTS (SELECT 1 FROM nodes_view WHERE pool=$1)",
        pool))
