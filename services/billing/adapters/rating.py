"""Price-list versions, usage records and storage report state in the billing schema (asyncpg), on the unit
of work's connection (the caller owns the transaction)."""
from __future__ import annotations

import json
import uuid
from datetime import datetime

import asyncpg

from ..domain.pricing import PriceList
from ..domain.usage import Rating, UsageRecord, version_from_doc
from .repository import HOUR_SUMS, HourTotals, hour_totals, totals_by_hour

PROVIDER = "tessera"
PRICE_LIST_LOCK = "billing.price_lists"


async def lock_price_lists(conn: asyncpg.Connection) -> None:
    """Serialise publications (held until the transaction ends): each checks against every stored version."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", PRICE_LIST_LOCK)


async def price_list(conn: asyncpg.Connection) -> PriceList:
    rows = await conn.fetch("SELECT body FROM price_list_versions ORDER BY effective_from")
    return PriceList(PROVIDER, tuple(version_from_doc(_doc(r["body"])) for r in rows))


def _doc(body) -> dict:
    doc = json.loads(body) if isinstance(body, str) else dict(body)
    doc["effective_from"] = datetime.fromisoformat(doc["effective_from"])
    return doc


async def store_version(conn: asyncpg.Connection, doc: dict, effective_from: datetime,
                        published_by: uuid.UUID) -> datetime:
    """Insert the version (``doc``: its wire document, JSON-ready), or replace a scheduled one of the same id
    (the domain decided it may); returns published_at."""
    body = json.dumps(doc)
    return await conn.fetchval(
        "INSERT INTO price_list_versions (version, currency, effective_from, body, published_by) "
        "VALUES ($1, $2, $3, $4::jsonb, $5) ON CONFLICT (version) DO UPDATE SET currency = EXCLUDED.currency, "
        "effective_from = EXCLUDED.effective_from, body = EXCLUDED.body, published_by = EXCLUDED.published_by, "
        "published_at = now() RETURNING published_at",
        doc["version"], doc["currency"], effective_from, body, published_by)


async def record_usage(conn: asyncpg.Connection, rated: list[tuple[UsageRecord, Rating, int]],
                       hours: list[tuple[uuid.UUID, datetime]]) -> dict[tuple[uuid.UUID, datetime], HourTotals]:
    """Insert the records (each rated, with its ledger seq) and return the totals of ``hours`` (tenant, UTC hour)
    with them, in one statement; a record already there (same source and event_id) is left as it is.

    The sums are the rows there before the statement (its snapshot: repository.HOUR_SUMS) plus those it
    inserted (RETURNING): one round trip under the ledger's lock instead of an insert and a read."""
    cols = list(zip(*((r.source, r.event_id, r.kind, r.tenant_id, r.user_id, r.allocation_id, r.volume_id, r.shape,
                       r.gpu_model, r.pool, r.spot, r.gpu_count, r.storage_class, r.period_start, r.period_end,
                       r.quantity_text, g.amount_minor, g.currency, g.rated, g.price_version, g.sku_price_id,
                       g.reason, seq) for r, g, seq in rated)))
    if not cols:
        return await hour_totals(conn, hours) if hours else {}
    rows = await conn.fetch(
        "WITH ins AS (INSERT INTO usage_records (source, event_id, kind, tenant_id, user_id, allocation_id, volume_id, "
        "shape, gpu_model, pool, spot, gpu_count, storage_class, period_start, period_end, quantity, amount_minor, "
        "currency, rated, price_version, sku_price_id, reason, ledger_seq) SELECT * FROM unnest($1::text[], "
        "$2::text[], $3::text[], $4::uuid[], $5::uuid[], $6::uuid[], $7::uuid[], $8::text[], $9::text[], $10::text[], "
        "$11::bool[], $12::int[], $13::text[], $14::timestamptz[], $15::timestamptz[], $16::numeric[], $17::bigint[], "
        "$18::text[], $19::bool[], $20::text[], $21::text[], $22::text[], $23::bigint[]) "
        "ON CONFLICT (source, event_id) DO NOTHING "
        "RETURNING tenant_id, period_start, kind, rated, currency, quantity, amount_minor), "
        "h AS (SELECT * FROM unnest($24::uuid[], $25::timestamptz[]) AS h(tenant_id, hour)), "
        f"x AS ({HOUR_SUMS.format(pairs='h')} UNION ALL SELECT h.tenant_id, h.hour, i.kind, i.rated, i.currency, "
        "i.quantity, i.amount_minor, 1 FROM h JOIN ins i ON i.tenant_id = h.tenant_id AND i.period_start >= h.hour "
        "AND i.period_start < h.hour + interval '1 hour') "
        "SELECT tenant_id, hour, kind, rated, currency, sum(quantity) AS quantity, sum(amount) AS amount, "
        "sum(n)::bigint AS n FROM x GROUP BY tenant_id, hour, kind, rated, currency",
        *map(list, cols), [t for t, _ in hours], [h for _, h in hours])
    return totals_by_hour(rows, hours)


async def new_records(conn: asyncpg.Connection, records: list[UsageRecord]) -> list[UsageRecord]:
    """The records not stored yet, in order, each key once (one query)."""
    if not records:
        return []
    stored = {(r["source"], r["event_id"]) for r in await conn.fetch(
        "SELECT source, event_id FROM usage_records WHERE (source, event_id) IN "
        "(SELECT * FROM unnest($1::text[], $2::text[]))", [r.source for r in records], [r.event_id for r in records])}
    out = []
    for r in records:
        if (r.source, r.event_id) not in stored:
            stored.add((r.source, r.event_id))
            out.append(r)
    return out


async def note_volume(conn: asyncpg.Connection, volume_id: uuid.UUID, tenant_id: uuid.UUID, user_id: uuid.UUID | None,
                      storage_class: str) -> None:
    await conn.execute(
        "INSERT INTO storage_volumes (volume_id, tenant_id, user_id, storage_class) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (volume_id) DO UPDATE SET user_id = EXCLUDED.user_id, storage_class = EXCLUDED.storage_class",
        volume_id, tenant_id, user_id, storage_class)


async def volume_for_report(conn: asyncpg.Connection, volume_id: uuid.UUID, tenant_id: uuid.UUID) -> asyncpg.Record:
    """The volume's row, locked until the transaction ends (created, class unknown, when it had none)."""
    await conn.execute("INSERT INTO storage_volumes (volume_id, tenant_id) VALUES ($1, $2) "
                       "ON CONFLICT (volume_id) DO NOTHING", volume_id, tenant_id)
    return await conn.fetchrow("SELECT * FROM storage_volumes WHERE volume_id=$1 FOR UPDATE", volume_id)


async def save_report(conn: asyncpg.Connection, volume_id: uuid.UUID, used_bytes: int, at: datetime) -> None:
    await conn.execute("UPDATE storage_volumes SET last_used_bytes=$2, last_report_at=$3 WHERE volume_id=$1",
                       volume_id, used_bytes, at)
