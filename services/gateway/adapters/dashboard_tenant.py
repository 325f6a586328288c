"""The dashboard's reads of one tenant's own things (services/gateway/ui/): networks, volumes, usage, the current
invoice, the budget and the audit trail. Every read takes the tenant and filters by it in SQL."""
from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from .keyset import Position, newest_first


async def networks(conn: asyncpg.Connection, tenant_id: uuid.UUID, limit: int) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT id, name, cidr::text AS cidr, state, created_at FROM networks_view "
                            "WHERE tenant_id = $1 AND state <> 'deleted' ORDER BY created_at, id LIMIT $2",
                            tenant_id, limit)


async def usage_since(conn: asyncpg.Connection, tenant_id: uuid.UUID, since: datetime) -> list[asyncpg.Record]:
    """The tenant's usage since ``since`` summed per kind and currency."""
    return await conn.fetch("SELECT kind, currency, sum(quantity) AS quantity, sum(amount_minor) AS amount_minor "
                            "FROM usage_view WHERE tenant_id = $1 AND period_start >= $2 GROUP BY kind, currency "
                            "ORDER BY kind", tenant_id, since)


async def current_invoice(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT invoice_id, number, period_start, status, doc FROM invoices_view "
                               "WHERE tenant_id = $1 ORDER BY period_start DESC, invoice_id DESC LIMIT 1", tenant_id)


async def budget(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT amount_minor, currency, spend_minor, forecast_minor, period_start "
                               "FROM budgets_view WHERE tenant_id = $1", tenant_id)


async def audit_page(conn: asyncpg.Connection, tenant_id: uuid.UUID, limit: int,
                     after: Position | None) -> list[asyncpg.Record]:
    """The tenant's audit records, newest first (the audit_log_tenant_time index)."""
    return await newest_first(conn, "SELECT audit_id AS id, event_time, user_id, role, action, method, path, outcome, "
                              "status FROM audit_log WHERE tenant_id = $1", [tenant_id], limit, after,
                              time="event_time", key="audit_id")
