"""Invoices, their lines and billed entries in the billing schema (asyncpg, schema/0004_invoices.sql), on the
unit of work's connection (the caller owns the transaction). Rules: services/billing/domain/invoices.py.

Locking: an entry is added under the invoice row's lock (``FOR UPDATE``), so it serialises with the finalizer,
which takes due invoices ``FOR UPDATE SKIP LOCKED`` (replicas split the work; one being billed is left for the
next pass)."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import asyncpg

from ..domain.invoices import LineSpec, Period, invoice_number

COLUMNS = ("id, tenant_id, number, period_start, period_end, grace_until, status, version, dirty, finalized_at, "
           "content_hash, updated_at")


async def billed_on(conn: asyncpg.Connection, ledger_seq: int) -> asyncpg.Record | None:
    """The invoice and line an entry is already billed on (invoice_id, correction), if any."""
    return await conn.fetchrow(
        "SELECT e.invoice_id, l.correction FROM invoice_entries e JOIN invoice_lines l "
        "ON l.invoice_id = e.invoice_id AND l.line_key = e.line_key WHERE e.ledger_seq = $1", ledger_seq)


async def statuses(conn: asyncpg.Connection, tenant_id: uuid.UUID, since: datetime) -> dict[datetime, str]:
    """The tenant's invoices from the month starting at ``since`` on: period start -> status."""
    rows = await conn.fetch("SELECT period_start, status FROM invoices WHERE tenant_id = $1 AND period_start >= $2",
                            tenant_id, since)
    return {r["period_start"]: r["status"] for r in rows}


async def lock_or_create(conn: asyncpg.Connection, tenant_id: uuid.UUID, period: Period,
                         grace: timedelta) -> asyncpg.Record:
    """The tenant's invoice of ``period``, locked FOR UPDATE until the transaction ends; created as an empty
    draft when missing (a concurrent creator wins the race harmlessly: ON CONFLICT DO NOTHING, then the lock
    waits for its commit)."""
    lock = f"SELECT {COLUMNS} FROM invoices WHERE tenant_id = $1 AND period_start = $2 FOR UPDATE"
    row = await conn.fetchrow(lock, tenant_id, period.start)
    if row is None:
        await conn.execute(
            "INSERT INTO invoices (id, tenant_id, number, period_start, period_end, grace_until) "
            "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant_id, period_start) DO NOTHING",
            uuid.uuid4(), tenant_id, invoice_number(tenant_id, period), period.start, period.end,
            period.grace_until(grace))
        row = await conn.fetchrow(lock, tenant_id, period.start)
    return row


async def add_entry(conn: asyncpg.Connection, invoice_id: uuid.UUID, line: LineSpec, quantity: str,
                    amount_minor: int, ledger_seq: int) -> None:
    """Add the ledger entry to its line (created on first use), bill it, and mark the invoice changed. The
    invoice must be locked by this transaction."""
    await conn.execute(
        "INSERT INTO invoice_lines (invoice_id, line_key, description, kind, correction, corrects_period, "
        "sku_price_id, price_list_version, unit, usage_quantity, amount_minor, currency, entries) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::numeric, $11, $12, 1) "
        "ON CONFLICT (invoice_id, line_key) DO UPDATE SET "
        "usage_quantity = invoice_lines.usage_quantity + EXCLUDED.usage_quantity, "
        "amount_minor = invoice_lines.amount_minor + EXCLUDED.amount_minor, entries = invoice_lines.entries + 1",
        invoice_id, line.line_key, line.description, line.kind, line.correction, line.corrects_period,
        line.sku_price_id, line.price_list_version, line.unit, quantity, amount_minor, line.currency)
    await conn.execute("INSERT INTO invoice_entries (ledger_seq, invoice_id, line_key) VALUES ($1, $2, $3)",
                       ledger_seq, invoice_id, line.line_key)
    await conn.execute("UPDATE invoices SET version = version + 1, dirty = true, updated_at = now() WHERE id = $1",
                       invoice_id)


async def get(conn: asyncpg.Connection, invoice_id: uuid.UUID) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {COLUMNS} FROM invoices WHERE id = $1", invoice_id)


async def lock_due(conn: asyncpg.Connection, now: datetime, limit: int) -> list[asyncpg.Record]:
    """Drafts whose grace ended by ``now``, locked; those another transaction holds are skipped."""
    return await conn.fetch(f"SELECT {COLUMNS} FROM invoices WHERE status = 'draft' AND grace_until <= $1 "
                            "ORDER BY grace_until, id LIMIT $2 FOR UPDATE SKIP LOCKED", now, limit)


async def lock_dirty(conn: asyncpg.Connection, limit: int) -> list[asyncpg.Record]:
    """Invoices changed since last published, locked; those another transaction holds are skipped."""
    return await conn.fetch(f"SELECT {COLUMNS} FROM invoices WHERE dirty ORDER BY updated_at, id LIMIT $1 "
                            "FOR UPDATE SKIP LOCKED", limit)


async def lines(conn: asyncpg.Connection, invoice_id: uuid.UUID) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT line_key, description, kind, correction, corrects_period, sku_price_id, price_list_version, unit, "
        "usage_quantity, amount_minor, currency, entries FROM invoice_lines WHERE invoice_id = $1 ORDER BY line_key",
        invoice_id)


async def ledger_sums(conn: asyncpg.Connection, invoice_id: uuid.UUID) -> list[asyncpg.Record]:
    """Per currency: the sum and count of the ledger entries billed on the invoice (read from the ledger)."""
    return await conn.fetch(
        "SELECT l.currency, sum(l.amount_minor)::bigint AS amount_minor, count(*) AS entries "
        "FROM invoice_entries e JOIN ledger_entries l ON l.seq = e.ledger_seq WHERE e.invoice_id = $1 "
        "GROUP BY l.currency ORDER BY l.currency", invoice_id)


async def finalize(conn: asyncpg.Connection, invoice_id: uuid.UUID, at: datetime, content_hash: str) -> asyncpg.Record:
    """Mark the (locked) draft finalized with its hash; it is published in the same transaction, so not dirty."""
    return await conn.fetchrow(
        f"UPDATE invoices SET status = 'finalized', finalized_at = $2, content_hash = $3, version = version + 1, "
        f"dirty = false, updated_at = now() WHERE id = $1 AND status = 'draft' RETURNING {COLUMNS}",
        invoice_id, at, content_hash)


async def published(conn: asyncpg.Connection, invoice_id: uuid.UUID) -> None:
    await conn.execute("UPDATE invoices SET dirty = false WHERE id = $1 AND dirty", invoice_id)
