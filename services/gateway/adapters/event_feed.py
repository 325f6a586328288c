"""The tenant event feed's reads: allocation_events in ``seq`` order, scoped by the allocation's tenant
(allocations_view), for GET /v1/events and the dashboard's live stream."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg

_SELECT = ("SELECT e.seq, e.allocation_id, a.tenant_id, e.type, e.envelope::text AS envelope "
           "FROM allocation_events e JOIN allocations_view a ON a.id = e.allocation_id")


@dataclass(frozen=True)
class FeedFilter:
    """Which events a feed carries: one tenant's (None: every tenant's, a provider admin's feed), optionally one
    allocation's, optionally the types starting with ``type_prefix``."""

    tenant_id: uuid.UUID | None = None
    allocation_id: uuid.UUID | None = None
    type_prefix: str | None = None

    def where(self, args: list) -> str:
        """The SQL conditions (AND-joined, or ``true``), their parameters appended to ``args``."""
        conds = []
        if self.tenant_id is not None:
            args.append(self.tenant_id)
            conds.append(f"a.tenant_id = ${len(args)}")
        if self.allocation_id is not None:
            args.append(self.allocation_id)
            conds.append(f"e.allocation_id = ${len(args)}")
        if self.type_prefix:
            # a prefix match on a text column, with LIKE's wildcards escaped (the prefix is client input)
            args.append(self.type_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
            conds.append(f"e.type LIKE ${len(args)}")
        return " AND ".join(conds) or "true"


async def head_seq(conn: asyncpg.Connection) -> int:
    """The newest event's seq (0: none yet)."""
    return await conn.fetchval("SELECT coalesce(max(seq), 0) FROM allocation_events")


async def events_between(conn: asyncpg.Connection, after_seq: int, upto: int, feed: FeedFilter,
                         limit: int) -> list[asyncpg.Record]:
    """Up to ``limit`` events in (``after_seq``, ``upto``] matching ``feed``, oldest first."""
    args: list = [after_seq, upto]
    where = feed.where(args)
    args.append(limit)
    return await conn.fetch(f"{_SELECT} WHERE e.seq > $1 AND e.seq <= $2 AND {where} ORDER BY e.seq "
                            f"LIMIT ${len(args)}", *args)


async def seqs_between(conn: asyncpg.Connection, low: int, high: int) -> list[int]:
    """Every seq committed in (low, high] (any tenant): what a reader has seen of that range."""
    return [r["seq"] for r in await conn.fetch("SELECT seq FROM allocation_events WHERE seq > $1 AND seq <= $2",
                                               low, high)]


async def late_events(conn: asyncpg.Connection, seqs: list[int], feed: FeedFilter) -> tuple[list[int], list[asyncpg.Record]]:
    """Of the ``seqs`` a reader skipped: those committed since (any tenant), and the ones of them matching
    ``feed``."""
    present = [r["seq"] for r in await conn.fetch("SELECT seq FROM allocation_events WHERE seq = ANY($1::bigint[])",
                                                  seqs)]
    if not present:
        return [], []
    args: list = [present]
    where = feed.where(args)
    rows = await conn.fetch(f"{_SELECT} WHERE e.seq = ANY($1::bigint[]) AND {where} ORDER BY e.seq", *args)
    return present, rows
