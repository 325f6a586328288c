"""A tenant's budget (billing's: set and deleted through billing.set_budget / billing.delete_budget, read from the
views billing's events feed) and the provider's spend cap on a tenant (the gateway's own: written here, checked by
``POST /v1/allocations`` through ``check_spend_cap``).

Who: a budget is the tenant's admins' and the provider admins'; the tenant's users get a 403, another tenant's
members a 404 (they learn nothing of it). The spend cap is set and removed by provider admins only; the tenant's
admins read it with the budget.

The webhook secret is write-only: sent to billing (which signs the calls with it), never stored in the gateway's
views nor returned, redacted in the audit trail (its member name holds ``secret``). A budget with a webhook_url and
no webhook_secret gets one generated here, returned once in the 202. ``has_webhook_secret`` is read from the
budget's webhook_url: the gateway never sends a URL without a secret.

Month-to-date spend comes from two places, on purpose: the budget's ``spend_minor``/``forecast_minor`` are billing's
own figures (its latest budget_changed); the spend cap's ``used_minor`` is summed here from usage_view (rated usage
records starting in the current UTC month, in the cap's currency), the same sum that refuses allocations, so what
the tenant reads is what is enforced.
"""
from __future__ import annotations

import json
import secrets
import uuid
from datetime import UTC, datetime

import asyncpg
from aiohttp import web

from services.billing.contracts import DeleteBudget, SetBudget

from ...adapters.admission import month_spend, month_start
from ...adapters.audit_state import StateReader, ids, select_object
from ...http.auth import principal_of, require_provider_admin
from ...http.endpoint import Endpoint, respond
from ...http.inputs import path_uuid, read_body
from ...http.params import TENANT_ID
from ...http.problems import forbidden, validation_problem
from ...http.schema_base import FieldError
from ...http.state import gateway_of
from ...http.tenancy import require_tenant, visible_tenant
from .budget_schemas import (
    BudgetAccepted,
    BudgetDeleteAccepted,
    BudgetOut,
    BudgetSet,
    BudgetView,
    CrossingOut,
    DeliveryOut,
    SpendCapOut,
    SpendCapSet,
    ThresholdOut,
)

DELIVERIES_SHOWN = 50


def _budget_admin(request: web.Request) -> uuid.UUID:
    """The path's tenant when the caller is its admin or a provider admin; 404 for another tenant's members, 403
    for the tenant's users."""
    tenant_id = visible_tenant(request)
    if not principal_of(request).may_manage_users_of(tenant_id):
        raise forbidden("only this tenant's admins (or a provider admin) may read or change its budget")
    return tenant_id


def _thresholds(body: BudgetSet) -> list[dict]:
    """The body's thresholds, each (percent, basis) once, in the order first listed."""
    unique: dict[tuple, dict] = {}
    for t in body.thresholds:
        unique.setdefault((t.percent, t.basis), t.model_dump())
    return list(unique.values())


async def put_budget(request: web.Request) -> web.Response:
    tenant_id = _budget_admin(request)
    caller = principal_of(request)
    body = await read_body(request, BudgetSet)
    if body.webhook_secret is not None and body.webhook_url is None:
        raise validation_problem([FieldError(field="webhook_secret", message="only with a webhook_url",
                                             code="no_webhook")])
    thresholds = _thresholds(body)
    generated = secrets.token_urlsafe(32) if body.webhook_url and body.webhook_secret is None else None
    secret = body.webhook_secret or generated
    async with gateway_of(request).unit_of_work("gateway.put_budget") as uow:
        await require_tenant(uow.conn, tenant_id)
        await uow.emit("billing.set_budget", SetBudget(
            tenant_id=tenant_id, amount_minor=body.amount_minor, currency=body.currency,
            thresholds=thresholds, webhook_url=body.webhook_url,
            webhook_secret=secret, requested_by=caller.user_id), correlation_id=f"budget:{tenant_id}",
            tenant_id=tenant_id)
    return respond(BudgetAccepted(
        tenant_id=tenant_id, amount_minor=body.amount_minor, currency=body.currency,
        thresholds=[ThresholdOut(**t) for t in thresholds], webhook_url=body.webhook_url,
        has_webhook_secret=secret is not None, webhook_secret=generated, status="applying"), 202)


async def delete_budget(request: web.Request) -> web.Response:
    tenant_id = _budget_admin(request)
    async with gateway_of(request).unit_of_work("gateway.delete_budget") as uow:
        await require_tenant(uow.conn, tenant_id)
        await uow.emit("billing.delete_budget", DeleteBudget(tenant_id=tenant_id, requested_by=principal_of(request).user_id),
                       correlation_id=f"budget:{tenant_id}", tenant_id=tenant_id)
    return respond(BudgetDeleteAccepted(tenant_id=tenant_id, status="deleting"), 202)


def _json(value) -> list:
    return json.loads(value) if isinstance(value, str) else list(value or [])


def _budget_out(row: asyncpg.Record | None) -> BudgetOut | None:
    if row is None or row["amount_minor"] is None:
        return None
    return BudgetOut(amount_minor=row["amount_minor"], currency=row["currency"],
                     thresholds=[ThresholdOut(**t) for t in _json(row["thresholds"])], webhook_url=row["webhook_url"],
                     has_webhook_secret=row["webhook_url"] is not None, period_start=row["period_start"],
                     spend_minor=row["spend_minor"], forecast_minor=row["forecast_minor"], version=row["version"],
                     updated_at=row["at"])


def _crossings(budget: asyncpg.Record | None, rows: list, since: datetime) -> list[CrossingOut]:
    """This month's crossings: the threshold_crossed events, and those billing's latest standing lists (which
    may come first)."""
    out = {(r["percent"], r["basis"]): CrossingOut(percent=r["percent"], basis=r["basis"], at=r["at"],
                                                   spend_minor=r["spend_minor"], forecast_minor=r["forecast_minor"])
           for r in rows}
    if budget is not None and budget["amount_minor"] is not None and budget["period_start"] >= since:
        for c in _json(budget["crossed"]):
            out.setdefault((c["percent"], c["basis"]), CrossingOut(percent=c["percent"], basis=c["basis"],
                                                                   at=datetime.fromisoformat(c["at"])))
    return sorted(out.values(), key=lambda c: (c.at, c.percent))


async def _spend_cap(conn: asyncpg.Connection, tenant_id: uuid.UUID, now: datetime) -> SpendCapOut | None:
    cap = await conn.fetchrow("SELECT * FROM tenant_spend_caps WHERE tenant_id=$1", tenant_id)
    if cap is None:
        return None
    used = await month_spend(conn, tenant_id, cap["currency"], now)
    return SpendCapOut(tenant_id=tenant_id, amount_minor=cap["amount_minor"], currency=cap["currency"],
                       used_minor=used, exceeded=used >= cap["amount_minor"], set_at=cap["set_at"])


async def get_budget(request: web.Request) -> web.Response:
    tenant_id = _budget_admin(request)
    now = datetime.now(UTC)
    async with gateway_of(request).pool.acquire() as conn:
        await require_tenant(conn, tenant_id)
        budget = await conn.fetchrow("SELECT * FROM budgets_view WHERE tenant_id=$1", tenant_id)
        crossings = await conn.fetch("SELECT * FROM budget_crossings_view WHERE tenant_id=$1 AND period_start >= $2",
                                     tenant_id, month_start(now))
        deliveries = await conn.fetch("SELECT * FROM webhook_deliveries_view WHERE tenant_id=$1 "
                                      "ORDER BY first_at DESC, delivery_id LIMIT $2", tenant_id, DELIVERIES_SHOWN)
        cap = await _spend_cap(conn, tenant_id, now)
    return respond(BudgetView(
        tenant_id=tenant_id, budget=_budget_out(budget), crossed=_crossings(budget, crossings, month_start(now)),
        deliveries=[DeliveryOut(delivery_id=d["delivery_id"], event=d["event"], url=d["url"], status=d["status"],
                                attempts=d["attempts"], last_status=d["last_status"], last_error=d["last_error"],
                                next_attempt_at=d["next_attempt_at"], delivered_at=d["delivered_at"],
                                updated_at=d["at"]) for d in deliveries],
        spend_cap=cap))


async def put_spend_cap(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    tenant_id = path_uuid(request, "tenant_id", "tenant")
    body = await read_body(request, SpendCapSet)
    now = datetime.now(UTC)
    async with gateway_of(request).unit_of_work("gateway.put_spend_cap") as uow:
        await require_tenant(uow.conn, tenant_id)
        await uow.conn.execute(
            "INSERT INTO tenant_spend_caps (tenant_id, amount_minor, currency, set_by, set_at) VALUES ($1, $2, $3, $4, "
            "$5) ON CONFLICT (tenant_id) DO UPDATE SET amount_minor=EXCLUDED.amount_minor, currency=EXCLUDED.currency, "
            "set_by=EXCLUDED.set_by, set_at=EXCLUDED.set_at", tenant_id, body.amount_minor, body.currency,
            admin.user_id, now)
        cap = await _spend_cap(uow.conn, tenant_id, now)
    return respond(cap)


async def delete_spend_cap(request: web.Request) -> web.Response:
    require_provider_admin(request)
    tenant_id = path_uuid(request, "tenant_id", "tenant")
    async with gateway_of(request).unit_of_work("gateway.delete_spend_cap") as uow:
        await require_tenant(uow.conn, tenant_id)
        await uow.conn.execute("DELETE FROM tenant_spend_caps WHERE tenant_id=$1", tenant_id)
    return web.Response(status=204)


_BUDGET = "/v1/tenants/{tenant_id}/budget"
_CAP = "/v1/tenants/{tenant_id}/spend-cap"
_WRITE_ERRORS = (400, 401, 403, 404, 413, 415, 422)

_BUDGET_STATE = StateReader(select_object("budgets_view", "tenant_id = $1", "amount_minor", "currency", "thresholds",
                                          "webhook_url", "version"), ids("tenant_id"))
_SPEND_CAP = StateReader(select_object("tenant_spend_caps", "tenant_id = $1", "amount_minor", "currency", "set_by",
                                       "set_at"), ids("tenant_id"))


ENDPOINTS = [
    Endpoint("PUT", _BUDGET, put_budget, "putBudget", "Set the tenant's monthly budget (the tenant's admins, or a "
             "provider admin)", "billing", {202: BudgetAccepted}, body=BudgetSet, params=(TENANT_ID,),
             errors=_WRITE_ERRORS,
             description="Replaces the budget whole; billing applies it (GET …/budget shows it then) and alerts once a "
                         "month per threshold, calling the webhook (signed with webhook_secret) when one is set. A "
                         "webhook_url without a webhook_secret gets one generated, returned once in this response; "
                         "the secret is never shown again. The tenant's users get 403, other tenants' members 404.",
             audit_state=_BUDGET_STATE),
    Endpoint("GET", _BUDGET, get_budget, "getBudget", "Read the tenant's budget, this month's standing, the crossed "
             "thresholds and webhook deliveries (the tenant's admins, or a provider admin)", "billing",
             {200: BudgetView}, params=(TENANT_ID,), errors=(401, 403, 404),
             description="`budget` is billing's latest word: the budget and this month's spend and forecast as billing "
                         "computed them. `spend_cap.used_minor` is summed by the gateway from rated usage (the figure "
                         "that refuses allocations). Deliveries: the latest 50 webhook calls and their state."),
    Endpoint("DELETE", _BUDGET, delete_budget, "deleteBudget", "Delete the tenant's budget (the tenant's admins, or a "
             "provider admin)", "billing", {202: BudgetDeleteAccepted}, params=(TENANT_ID,), errors=(401, 403, 404),
             description="Billing deletes it: no more alerts. Accepted whether or not a budget is set.",
             audit_state=_BUDGET_STATE),
    Endpoint("PUT", _CAP, put_spend_cap, "putSpendCap", "Cap a tenant's monthly spend (provider admin)", "billing",
             {200: SpendCapOut}, body=SpendCapSet, params=(TENANT_ID,), errors=_WRITE_ERRORS,
             description="Once the tenant's rated spend this month (UTC) in the currency reaches amount_minor, "
                         "POST /v1/allocations is refused with 403 `spend-cap-exceeded`; running allocations are "
                         "untouched. Enforced by the gateway only, from its view of rated usage (usage is rated "
                         "when metered, so the spend can pass the cap by what runs meanwhile).",
             audit_state=_SPEND_CAP),
    Endpoint("DELETE", _CAP, delete_spend_cap, "deleteSpendCap", "Remove a tenant's spend cap (provider admin)",
             "billing", {204: None}, params=(TENANT_ID,), errors=(401, 403, 404),
             description="New allocations are no longer refused for spend. Answered 204 whether or not one was set.",
             audit_state=_SPEND_CAP),
]
