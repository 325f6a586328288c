"""Invoices, their lines and billed entries in the billing schema (asyncpg, schema/0004_invoices.sql), on the
unit of work's connection (the caller owns the transaction). Rules: services/billing/domain/invoices.py.

Locking: an entry is added under the invoice row's lock (``FOR UPDATE``), so it serialises with the finalizer,
which takes due invoices ``FOR UPDATE SKIP LOCKED`` (replicas split the work; one being billed is left for the
next pass)."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import NamedTuple

import asyncpg

from ..domain.invoices import LineSpec, Period, invoice_number

COLUMNS = ("id, tenant_id, number, period_start, period_end, grace_until, status, version, dirty, finalized_at, "
           "content_hash, updated_at")


async def billed_on(conn: asyncpg.Connection, ledger_seqs: list[int]) -> dict[int, tuple[uuid.UUID, bool]]:
    """The entries already billed, of these: ledger_seq → (invoice_id, correction)."""
    rows = await conn.fetch(
        "SELECT e.ledger_seq, e.invoice_id, l.correction FROM invoice_entries e JOIN invoice_lines l "
        "ON l.invoice_id = e.invoice_id AND l.line_key = e.line_key WHERE e.ledger_seq = ANY($1::bigint[])",
        ledger_seqs)
    return {r["ledger_seq"]: (r["invoice_id"], r["correction"]) for r in rows}


async def statuses(conn: asyncpg.Connection, tenant_ids: list[uuid.UUID],
                   since: datetime) -> dict[uuid.UUID, dict[datetime, str]]:
    """These tenants' invoices from the month starting at ``since`` on: tenant → period start → status."""
    rows = await conn.fetch("SELECT tenant_id, period_start, status FROM invoices "
                            "WHERE tenant_id = ANY($1::uuid[]) AND period_start >= $2", tenant_ids, since)
    out: dict[uuid.UUID, dict[datetime, str]] = {}
    for r in rows:
        out.setdefault(r["tenant_id"], {})[r["period_start"]] = r["status"]
    return out


async def lock_or_create(conn: asyncpg.Connection, wanted: list[tuple[uuid.UUID, Period]],
                         grace: timedelta) -> dict[tuple[uuid.UUID, datetime], asyncpg.Record]:
    """The invoices of these (tenant, period)s, locked FOR UPDATE until the transaction ends, in one order
    (tenant, period) whoever asks; each missing one created first as an empty draft (a concurrent creator
    wins the race harmlessly: ON CONFLICT DO NOTHING, then the lock waits for its commit). Keyed by
    (tenant, period start)."""
    wanted = sorted(set(wanted), key=lambda w: (w[0], w[1].start))
    await conn.execute(
        "INSERT INTO invoices (id, tenant_id, number, period_start, period_end, grace_until) "
        "SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::timestamptz[], $5::timestamptz[], "
        "$6::timestamptz[]) ON CONFLICT (tenant_id, period_start) DO NOTHING",
        [uuid.uuid4() for _ in wanted], [t for t, _ in wanted], [invoice_number(t, p) for t, p in wanted],
        [p.start for _, p in wanted], [p.end for _, p in wanted], [p.grace_until(grace) for _, p in wanted])
    rows = await conn.fetch(
        f"SELECT {COLUMNS} FROM invoices WHERE (tenant_id, period_start) IN "
        "(SELECT * FROM unnest($1::uuid[], $2::timestamptz[])) ORDER BY tenant_id, period_start FOR UPDATE",
        [t for t, _ in wanted], [p.start for _, p in wanted])
    return {(r["tenant_id"], r["period_start"]): r for r in rows}


class Billing(NamedTuple):
    """One ledger entry to bill: its invoice (locked by this transaction), line and sums."""
    invoice_id: uuid.UUID
    line: LineSpec
    quantity: str
    amount_minor: int
    ledger_seq: int


async def add_entries(conn: asyncpg.Connection, entries: list[Billing]) -> set[int]:
    """Bill the ledger entries not billed yet on their lines (each created on first use) and mark their
    invoices changed (the version grows by one per entry); returns the seqs billed now (an entry already
    billed, on whatever invoice, is left as it is). Their invoices must be locked by this transaction. One
    statement however many entries: the entries first (the primary key decides which are new), then the
    lines and invoices of those."""
    if not entries:
        return set()
    columns = list(zip(*((e.ledger_seq, e.invoice_id, e.line.line_key, e.line.description, e.line.kind,
                          e.line.correction, e.line.corrects_period, e.line.sku_price_id, e.line.price_list_version,
                          e.line.unit, e.quantity, e.amount_minor, e.line.currency) for e in entries)))
    rows = await conn.fetch(
        "WITH e AS (INSERT INTO invoice_entries (ledger_seq, invoice_id, line_key) "
        "SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[]) ON CONFLICT (ledger_seq) DO NOTHING "
        "RETURNING ledger_seq), "
        "x AS (SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::bool[], "
        "$7::text[], $8::text[], $9::text[], $10::text[], $11::numeric[], $12::bigint[], $13::text[]) "
        "AS x(seq, i, k, d, kd, c, cp, s, v, u, q, a, cur) WHERE seq IN (SELECT ledger_seq FROM e)), "
        "l AS (INSERT INTO invoice_lines (invoice_id, line_key, description, kind, correction, corrects_period, "
        "sku_price_id, price_list_version, unit, usage_quantity, amount_minor, currency, entries) "
        "SELECT i, k, min(d), min(kd), bool_or(c), min(cp), min(s), min(v), min(u), sum(q), sum(a)::bigint, min(cur), "
        "count(*) FROM x GROUP BY i, k ON CONFLICT (invoice_id, line_key) DO UPDATE SET "
        "usage_quantity = invoice_lines.usage_quantity + EXCLUDED.usage_quantity, "
        "amount_minor = invoice_lines.amount_minor + EXCLUDED.amount_minor, "
        "entries = invoice_lines.entries + EXCLUDED.entries), "
        "n AS (UPDATE invoices i SET version = i.version + n.entries, dirty = true, updated_at = now() "
        "FROM (SELECT x.i AS id, count(*) AS entries FROM x GROUP BY x.i) n WHERE i.id = n.id) "
        "SELECT ledger_seq FROM e", *map(list, columns))
    return {r["ledger_seq"] for r in rows}


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
