"""The audit trail in PostgreSQL (asyncpg): filtered keyset pages and a streamed export of audit_log rows.
Appends go through shared.ledger_store.append (http/audit.py); this module only reads."""
from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from ...adapters.keyset import newest_first

COLS = ("seq, audit_id, audit_id AS id, event_time, tenant_id, user_id, role, action, method, path, target_type, "
        "target_id, outcome, status, request_id, record, row_hash, created_at")


@dataclass(frozen=True)
class AuditFilter:
    """What GET /v1/audit narrows to; None: any. ``tenant_id`` is set by the caller's role, not by the client."""
    tenant_id: uuid.UUID | None = None
    since: datetime | None = None
    until: datetime | None = None
    action: str | None = None
    target_type: str | None = None
    target_id: str | None = None
    user_id: uuid.UUID | None = None
    outcome: str | None = None

    def where(self) -> tuple[str, list]:
        """The WHERE clause (``TRUE`` when nothing narrows) and its arguments, positions from $1."""
        terms, args = [], []
        for sql, value in (("tenant_id = ${}", self.tenant_id), ("event_time >= ${}", self.since),
                           ("event_time < ${}", self.until), ("action = ${}", self.action),
                           ("target_type = ${}", self.target_type), ("target_id = ${}", self.target_id),
                           ("user_id = ${}", self.user_id), ("outcome = ${}", self.outcome)):
            if value is not None:
                args.append(value)
                terms.append(sql.format(len(args)))
        return " AND ".join(terms) or "TRUE", args


async def page(conn: asyncpg.Connection, f: AuditFilter, limit: int,
               after: tuple[datetime, uuid.UUID] | None) -> list[asyncpg.Record]:
    """Up to ``limit`` records matching ``f``, newest first, strictly older than the ``after`` position."""
    where, args = f.where()
    return await newest_first(conn, f"SELECT {COLS} FROM audit_log WHERE {where}", args, limit, after,
                              time="event_time", key="audit_id")


async def stream(conn: asyncpg.Connection, f: AuditFilter) -> AsyncIterator[asyncpg.Record]:
    """Every record matching ``f``, oldest first (seq order), through a server-side cursor (memory does not grow
    with the trail). Needs a transaction on ``conn``."""
    where, args = f.where()
    async for row in conn.cursor(f"SELECT {COLS} FROM audit_log WHERE {where} ORDER BY seq", *args, prefetch=500):
        yield row
