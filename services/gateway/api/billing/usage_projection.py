"""Billing's publications, for reads: price_lists_view, price_list_rejections and usage_view, fed by
billing.* events (each in the consumer's transaction, inbox-deduped; every write is idempotent: a replayed
event changes nothing)."""
from __future__ import annotations

import json

from services.billing import contracts as bc
from shared.unit_of_work import UnitOfWork


async def on_price_list_published(ctx: UnitOfWork, data: bc.PriceListPublished) -> None:
    """A version replaces the one shown under its id only when published later (a rescheduled version)."""
    body = data.model_dump(mode="json", exclude={"published_by", "published_at"})
    await ctx.conn.execute(
        "INSERT INTO price_lists_view (version, currency, effective_from, body, published_by, published_at) "
        "VALUES ($1, $2, $3, $4::jsonb, $5, $6) ON CONFLICT (version) DO UPDATE SET currency=EXCLUDED.currency, "
        "effective_from=EXCLUDED.effective_from, body=EXCLUDED.body, published_by=EXCLUDED.published_by, "
        "published_at=EXCLUDED.published_at WHERE price_lists_view.published_at < EXCLUDED.published_at",
        data.version, data.currency, data.effective_from, json.dumps(body), data.published_by, data.published_at)


async def on_price_list_rejected(ctx: UnitOfWork, data: bc.PriceListRejected) -> None:
    await ctx.conn.execute(
        "INSERT INTO price_list_rejections (event_id, version, reason, field, requested_by, at) "
        "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        ctx.causation.id, data.version, data.reason, data.field, data.requested_by, data.at)


async def on_usage_rated(ctx: UnitOfWork, data: bc.UsageRated) -> None:
    """One row per usage key (billing rates a record once): with the invoice it was billed on, whether it is a
    correction, its list amount and list price (for the FOCUS export)."""
    await ctx.conn.execute(
        "INSERT INTO usage_view (usage_key, kind, tenant_id, user_id, allocation_id, volume_id, shape, gpu_model, pool, "
        "spot, storage_class, period_start, period_end, quantity, amount_minor, currency, rated, price_version, "
        "invoice_id, correction, list_amount_minor, micros_per_unit_hour, sku_price_id) "
        "VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14::numeric,$15,$16,$17,$18,$19,$20,$21,$22,$23) "
        "ON CONFLICT DO NOTHING",
        data.usage_key, data.kind, data.tenant_id, data.user_id, data.allocation_id, data.volume_id, data.shape,
        data.gpu_model, data.pool, data.spot, data.storage_class, data.period_start, data.period_end, data.quantity,
        data.amount_minor, data.currency, data.rated, data.price_list_version, data.invoice_id, data.correction,
        data.list_amount_minor, data.micros_per_unit_hour, data.sku_price_id)
