"""Budgets, their crossings and webhook deliveries in the billing schema (asyncpg), on the caller's connection
(the caller owns the transaction). The webhook secret is read here and by the webhook caller only."""
from __future__ import annotations

import json
import uuid
from datetime import date, datetime

import asyncpg

from ..domain.budgets import Attempt, Budget, Threshold


def _thresholds(raw) -> tuple[Threshold, ...]:
    items = json.loads(raw) if isinstance(raw, str) else raw
    return tuple(Threshold(int(t["percent"]), t["basis"]) for t in items)


def budget_of(row: asyncpg.Record) -> Budget | None:
    if row is None or row["amount_minor"] is None:
        return None
    return Budget(row["amount_minor"], row["currency"], _thresholds(row["thresholds"]))


async def get(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM budgets WHERE tenant_id=$1", tenant_id)


async def active_for(conn: asyncpg.Connection, tenant_ids: list[uuid.UUID]) -> list[asyncpg.Record]:
    """The budgets of these tenants that exist (one primary-key lookup: cheap for tenants without one)."""
    return await conn.fetch("SELECT * FROM budgets WHERE tenant_id = ANY($1::uuid[]) AND amount_minor IS NOT NULL "
                            "ORDER BY tenant_id", tenant_ids)


async def put(conn: asyncpg.Connection, tenant_id: uuid.UUID, budget: Budget, webhook_url: str | None,
              webhook_secret: str | None, now: datetime) -> asyncpg.Record:
    """Store or replace the tenant's budget (its version grows by one); returns the row."""
    thresholds = json.dumps([{"percent": t.percent, "basis": t.basis} for t in budget.thresholds])
    return await conn.fetchrow(
        "INSERT INTO budgets (tenant_id, amount_minor, currency, thresholds, webhook_url, webhook_secret, updated_at) "
        "VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7) ON CONFLICT (tenant_id) DO UPDATE SET "
        "amount_minor=EXCLUDED.amount_minor, currency=EXCLUDED.currency, thresholds=EXCLUDED.thresholds, "
        "webhook_url=EXCLUDED.webhook_url, webhook_secret=EXCLUDED.webhook_secret, updated_at=EXCLUDED.updated_at, "
        "version=budgets.version + 1 RETURNING *",
        tenant_id, budget.amount_minor, budget.currency, thresholds, webhook_url, webhook_secret, now)


async def remove(conn: asyncpg.Connection, tenant_id: uuid.UUID, now: datetime) -> int:
    """Delete the tenant's budget, keeping a tombstone so its version keeps growing; returns that version."""
    return await conn.fetchval(
        "INSERT INTO budgets (tenant_id, updated_at) VALUES ($1, $2) ON CONFLICT (tenant_id) DO UPDATE SET "
        "amount_minor=NULL, currency=NULL, thresholds='[]', webhook_url=NULL, webhook_secret=NULL, "
        "updated_at=EXCLUDED.updated_at, version=budgets.version + 1 RETURNING version", tenant_id, now)


async def month_spend(conn: asyncpg.Connection, tenant_id: uuid.UUID, currency: str, start: datetime,
                      end: datetime) -> int:
    """Rated usage amounts in ``currency`` whose period starts in [start, end) (index usage_records_tenant)."""
    return int(await conn.fetchval(
        "SELECT coalesce(sum(amount_minor), 0) FROM usage_records WHERE tenant_id=$1 AND currency=$2 "
        "AND period_start >= $3 AND period_start < $4", tenant_id, currency, start, end))


async def crossings(conn: asyncpg.Connection, tenant_id: uuid.UUID, month: date) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT percent, basis, crossed_at FROM budget_crossings WHERE tenant_id=$1 AND month=$2 "
                            "ORDER BY crossed_at, percent, basis", tenant_id, month)


async def record_crossing(conn: asyncpg.Connection, tenant_id: uuid.UUID, month: date, t: Threshold, budget: Budget,
                          spend_minor: int, forecast_minor: int, at: datetime) -> bool:
    """Note the crossing unless this month already has it; True when it is new."""
    status = await conn.execute(
        "INSERT INTO budget_crossings (tenant_id, month, percent, basis, budget_minor, spend_minor, forecast_minor, "
        "currency, crossed_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9) ON CONFLICT DO NOTHING",
        tenant_id, month, t.percent, t.basis, budget.amount_minor, spend_minor, forecast_minor, budget.currency, at)
    return status.endswith(" 1")


# --- webhook deliveries -----------------------------------------------------------------------------------------
async def add_delivery(conn: asyncpg.Connection, delivery_id: uuid.UUID, tenant_id: uuid.UUID, event: str,
                       url: str, secret: str | None, body: dict, now: datetime) -> None:
    await conn.execute(
        "INSERT INTO webhook_deliveries (id, tenant_id, event, url, secret, body, status, next_attempt_at, created_at) "
        "VALUES ($1, $2, $3, $4, $5, $6::jsonb, 'pending', $7, $7)",
        delivery_id, tenant_id, event, url, secret, json.dumps(body), now)


async def claim_due(conn: asyncpg.Connection, now: datetime, lease_until: datetime, limit: int) -> list[asyncpg.Record]:
    """Take up to ``limit`` pending deliveries due at ``now``: each is leased (next_attempt_at = lease_until), so
    no other caller takes it before its call ended and was recorded. Short: commit it before calling."""
    return await conn.fetch(
        "UPDATE webhook_deliveries d SET next_attempt_at=$2 FROM (SELECT id FROM webhook_deliveries "
        "WHERE status='pending' AND next_attempt_at <= $1 ORDER BY next_attempt_at LIMIT $3 FOR UPDATE SKIP LOCKED) due "
        "WHERE d.id = due.id RETURNING d.*", now, lease_until, limit)


async def save_attempt(conn: asyncpg.Connection, delivery_id: uuid.UUID, attempt: Attempt, last_status: int | None,
                       last_error: str | None, at: datetime) -> asyncpg.Record | None:
    """Record one call's outcome (only on a delivery still pending at the attempt before: a late duplicate
    changes nothing); None when it did not apply."""
    return await conn.fetchrow(
        "UPDATE webhook_deliveries SET status=$2, attempts=$3, next_attempt_at=$4, last_status=$5, last_error=$6, "
        "delivered_at = CASE WHEN $2 = 'delivered' THEN $7 ELSE delivered_at END "
        "WHERE id=$1 AND status='pending' AND attempts = $3 - 1 RETURNING *",
        delivery_id, attempt.status, attempt.attempts, attempt.next_attempt_at, last_status, last_error, at)
