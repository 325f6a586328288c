"""Budgets, threshold crossings and webhook deliveries as billing publishes them: budgets_view,
budget_crossings_view and webhook_deliveries_view (0014_budgets.sql), read by ``GET /v1/tenants/{id}/budget``.

Each handler runs in the consumer's transaction (inbox-deduped) and every write is idempotent and order-proof:
- a budget row is replaced by a higher ``version``; once deleted (amount null), also by any later event (``at``),
  so a budget set again after a deletion shows even if billing counts its versions afresh;
- a crossing is kept once per (tenant, month, percent, basis): the first event;
- a delivery row is replaced only by a later state: more attempts, or as many at a later ``at``.
"""
from __future__ import annotations

import json

from services.billing import contracts as bc
from shared.unit_of_work import UnitOfWork


async def on_budget_changed(ctx: UnitOfWork, data: bc.BudgetChanged) -> None:
    await ctx.conn.execute(
        "INSERT INTO budgets_view (tenant_id, amount_minor, currency, thresholds, webhook_url, period_start, "
        "spend_minor, forecast_minor, crossed, version, at) VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9::jsonb, "
        "$10, $11) ON CONFLICT (tenant_id) DO UPDATE SET amount_minor=EXCLUDED.amount_minor, "
        "currency=EXCLUDED.currency, thresholds=EXCLUDED.thresholds, webhook_url=EXCLUDED.webhook_url, "
        "period_start=EXCLUDED.period_start, spend_minor=EXCLUDED.spend_minor, forecast_minor=EXCLUDED.forecast_minor, "
        "crossed=EXCLUDED.crossed, version=EXCLUDED.version, at=EXCLUDED.at "
        "WHERE EXCLUDED.version > budgets_view.version "
        "OR (budgets_view.amount_minor IS NULL AND EXCLUDED.at > budgets_view.at)",
        data.tenant_id, data.amount_minor, data.currency,
        json.dumps([t.model_dump(mode="json") for t in data.thresholds]), data.webhook_url, data.period_start,
        data.spend_minor, data.forecast_minor, json.dumps([c.model_dump(mode="json") for c in data.crossed]),
        data.version, data.at)


async def on_threshold_crossed(ctx: UnitOfWork, data: bc.BudgetThresholdCrossed) -> None:
    await ctx.conn.execute(
        "INSERT INTO budget_crossings_view (tenant_id, period_start, percent, basis, period_end, budget_minor, "
        "spend_minor, forecast_minor, currency, at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) "
        "ON CONFLICT DO NOTHING",
        data.tenant_id, data.period_start, data.percent, data.basis, data.period_end, data.budget_minor,
        data.spend_minor, data.forecast_minor, data.currency, data.at)


async def on_webhook_delivery_changed(ctx: UnitOfWork, data: bc.WebhookDeliveryChanged) -> None:
    await ctx.conn.execute(
        "INSERT INTO webhook_deliveries_view (delivery_id, tenant_id, event, url, status, attempts, last_status, "
        "last_error, next_attempt_at, delivered_at, first_at, at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, "
        "$11, $11) ON CONFLICT (delivery_id) DO UPDATE SET status=EXCLUDED.status, attempts=EXCLUDED.attempts, "
        "last_status=EXCLUDED.last_status, last_error=EXCLUDED.last_error, next_attempt_at=EXCLUDED.next_attempt_at, "
        "delivered_at=EXCLUDED.delivered_at, url=EXCLUDED.url, at=EXCLUDED.at, "
        "first_at=least(webhook_deliveries_view.first_at, EXCLUDED.first_at) "
        "WHERE (EXCLUDED.attempts, EXCLUDED.at) > (webhook_deliveries_view.attempts, webhook_deliveries_view.at)",
        data.delivery_id, data.tenant_id, data.event, data.url, data.status, data.attempts, data.last_status,
        data.last_error, data.next_attempt_at, data.delivered_at, data.at)
