"""Spot offerings in the paas schema (asyncpg, on the caller's connection and transaction): one row per pool
holding the whole offering as a document, and the index of its nodes' allocations."""
from __future__ import annotations

import dataclasses
import json
import uuid

import asyncpg

from ..domain.offering import Offering, SpotNode

_UUIDS = ("tenant_id", "user_id")
_NODE_UUIDS = ("allocation_id", "node_id")


def _dump(off: Offering) -> str:
    doc = dataclasses.asdict(off)
    for k in _UUIDS:
        doc[k] = str(doc[k])
    for n in doc["nodes"]:
        for k in _NODE_UUIDS:
            n[k] = str(n[k]) if n[k] is not None else None
    return json.dumps(doc)


def _load(raw: str) -> Offering:
    doc = json.loads(raw)
    for k in _UUIDS:
        doc[k] = uuid.UUID(doc[k])
    nodes = []
    for n in doc.pop("nodes"):
        for k in _NODE_UUIDS:
            n[k] = uuid.UUID(n[k]) if n[k] is not None else None
        nodes.append(SpotNode(**n))
    return Offering(**doc, nodes=nodes)


class SpotStore:
    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    async def get(self, pool: str, *, lock: bool = False) -> Offering | None:
        raw = await self.conn.fetchval(f"SELECT doc FROM spot_offerings WHERE pool=$1{' FOR UPDATE' if lock else ''}",
                                       pool)
        return _load(raw) if raw is not None else None

    async def all(self, *, lock: bool = False) -> list[Offering]:
        """Every offering, by pool (locked in that order: two writers never deadlock)."""
        rows = await self.conn.fetch(f"SELECT doc FROM spot_offerings ORDER BY pool{' FOR UPDATE' if lock else ''}")
        return [_load(r["doc"]) for r in rows]

    async def working(self, *, lock: bool = False) -> list[Offering]:
        """Offerings enabled, or still holding nodes."""
        rows = await self.conn.fetch(
            "SELECT doc FROM spot_offerings WHERE enabled OR EXISTS (SELECT 1 FROM jsonb_array_elements(doc->'nodes') n "
            "WHERE n->>'state' IN ('requested', 'offered', 'reclaiming')) ORDER BY pool"
            f"{' FOR UPDATE' if lock else ''}")
        return [_load(r["doc"]) for r in rows]

    async def of_node(self, allocation_id: uuid.UUID) -> Offering | None:
        """The offering holding the allocation as a spot node, locked; None for any other allocation."""
        pool = await self.conn.fetchval("SELECT pool FROM spot_nodes WHERE allocation_id=$1", allocation_id)
        return await self.get(pool, lock=True) if pool is not None else None

    async def save(self, off: Offering) -> None:
        """Write the offering (its version one higher) and index its nodes."""
        off.version += 1
        await self.conn.execute(
            "INSERT INTO spot_offerings (pool, doc, enabled, version, updated_at) VALUES ($1, $2, $3, $4, now()) "
            "ON CONFLICT (pool) DO UPDATE SET doc=EXCLUDED.doc, enabled=EXCLUDED.enabled, version=EXCLUDED.version, "
            "updated_at=now()", off.pool, _dump(off), off.enabled, off.version)
        await self.conn.execute(
            "INSERT INTO spot_nodes (allocation_id, pool) SELECT unnest($1::uuid[]), $2 ON CONFLICT DO NOTHING",
            [n.allocation_id for n in off.nodes], off.pool)
