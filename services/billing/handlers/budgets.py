"""Budgets, thresholds and their webhooks (rules: domain/budgets.py).

- ``set_budget`` / ``delete_budget`` store or remove the tenant's monthly budget and publish
  ``billing.budget_changed`` with this month's standing (a deleted budget: ``amount_minor`` None). Setting a
  budget checks its thresholds at once (a budget set below this month's spend is crossed now).
- ``usage_recorded`` (in the transaction that stored new usage) checks the budgets of the tenants concerned:
  one primary-key query, nothing more for tenants without a budget. Each threshold newly crossed this month
  is noted once (a unique row), published as ``billing.budget_threshold_crossed`` and, when the budget has a
  webhook, queued as a pending delivery (``billing.webhook_delivery_changed``); then budget_changed.
- ``deliver_due`` claims due deliveries in a short transaction (a lease: next_attempt_at moved past the call's
  timeout, ``FOR UPDATE SKIP LOCKED``), calls them outside any transaction, then records each outcome and
  publishes webhook_delivery_changed. The secret stays in billing's schema: no event or log line carries it.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime, timedelta

import asyncpg
import structlog

from shared.envelope import utcnow
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters import budgets as store
from ..adapters.webhooks import CallOutcome, WebhookCaller
from ..domain.budgets import Budget, Threshold, after_attempt, callable_url, month_of, newly_crossed, standing
from ..settings import BillingSettings

log = structlog.get_logger()
EVENT = "budget.threshold_crossed"
BATCH = 50


def _correlation(tenant_id: uuid.UUID) -> str:
    return f"budget:{tenant_id}"


async def set_budget(ctx: UnitOfWork, cmd: c.SetBudget, *, clock=utcnow) -> None:
    now = clock()
    if cmd.webhook_url and not callable_url(cmd.webhook_url):
        log.warning("billing.budget_webhook_not_callable", tenant_id=str(cmd.tenant_id),
                    reason="only http and https URLs are called")
    budget = Budget(cmd.amount_minor, cmd.currency, tuple(Threshold(t.percent, t.basis) for t in cmd.thresholds))
    row = await store.put(ctx.conn, cmd.tenant_id, budget, cmd.webhook_url, cmd.webhook_secret, now)
    await _check(ctx, row, now)


async def delete_budget(ctx: UnitOfWork, cmd: c.DeleteBudget, *, clock=utcnow) -> None:
    now = clock()
    version = await store.remove(ctx.conn, cmd.tenant_id, now)
    await ctx.emit("billing.budget_changed", c.BudgetChanged(
        tenant_id=cmd.tenant_id, amount_minor=None, currency=None, thresholds=[], webhook_url=None,
        period_start=month_of(now)[0], spend_minor=0, forecast_minor=0, crossed=[], version=version, at=now),
        correlation_id=_correlation(cmd.tenant_id), tenant_id=cmd.tenant_id)


async def budgeted(ctx: UnitOfWork, tenant_ids: list[uuid.UUID]) -> list[asyncpg.Record]:
    """The budgets of these tenants (rating reads them before it takes the ledger's lock)."""
    return await store.active_for(ctx.conn, list(tenant_ids)) if tenant_ids else []


async def usage_recorded(ctx: UnitOfWork, tenant_ids: list[uuid.UUID], *, now: datetime | None = None,
                         budgets: list[asyncpg.Record] | None = None) -> None:
    """After new usage of these tenants is rated (caller's transaction): check their budgets' thresholds
    (``budgets``: their rows as ``budgeted`` read them, else read now)."""
    now = now or utcnow()
    for row in budgets if budgets is not None else await budgeted(ctx, tenant_ids):
        await _check(ctx, row, now)


async def _check(ctx: UnitOfWork, row: asyncpg.Record, now: datetime) -> None:
    """Cross what this month's standing crosses (once each), then publish the budget's standing."""
    tenant_id, budget = row["tenant_id"], store.budget_of(row)
    start, end = month_of(now)
    s = standing(await store.month_spend(ctx.conn, tenant_id, budget.currency, start, end), now)
    seen = await store.crossings(ctx.conn, tenant_id, start.date())
    already = {Threshold(r["percent"], r["basis"]) for r in seen}
    for t in newly_crossed(budget, s, already):
        if await store.record_crossing(ctx.conn, tenant_id, start.date(), t, budget, s.spend_minor,
                                       s.forecast_minor, now):
            await _crossed(ctx, row, budget, t, s, now)
    seen = await store.crossings(ctx.conn, tenant_id, start.date())
    await ctx.emit("billing.budget_changed", c.BudgetChanged(
        tenant_id=tenant_id, amount_minor=budget.amount_minor, currency=budget.currency,
        thresholds=[c.BudgetThreshold(percent=t.percent, basis=t.basis) for t in budget.thresholds],
        webhook_url=row["webhook_url"], period_start=start, spend_minor=s.spend_minor,
        forecast_minor=s.forecast_minor, version=row["version"], at=now,
        crossed=[c.CrossedThreshold(percent=r["percent"], basis=r["basis"], at=r["crossed_at"]) for r in seen]),
        correlation_id=_correlation(tenant_id), tenant_id=tenant_id)


async def _crossed(ctx: UnitOfWork, row: asyncpg.Record, budget: Budget, t: Threshold, s, now: datetime) -> None:
    tenant_id = row["tenant_id"]
    event = c.BudgetThresholdCrossed(
        tenant_id=tenant_id, period_start=s.period_start, period_end=s.period_end, percent=t.percent, basis=t.basis,
        budget_minor=budget.amount_minor, spend_minor=s.spend_minor, forecast_minor=s.forecast_minor,
        currency=budget.currency, at=now)
    await ctx.emit("billing.budget_threshold_crossed", event, correlation_id=_correlation(tenant_id),
                   tenant_id=tenant_id)
    log.info("billing.budget_threshold_crossed", tenant_id=str(tenant_id), percent=t.percent, basis=t.basis)
    if not row["webhook_url"]:
        return
    delivery_id = uuid.uuid4()
    body = {**event.model_dump(mode="json"), "type": EVENT, "delivery_id": str(delivery_id)}
    await store.add_delivery(ctx.conn, delivery_id, tenant_id, EVENT, row["webhook_url"], row["webhook_secret"],
                             body, now)
    await ctx.emit("billing.webhook_delivery_changed", c.WebhookDeliveryChanged(
        delivery_id=delivery_id, tenant_id=tenant_id, event=EVENT, url=row["webhook_url"], status="pending",
        attempts=0, next_attempt_at=now, at=now), correlation_id=_correlation(tenant_id), tenant_id=tenant_id)


# --- webhook calls ----------------------------------------------------------------------------------------------
def body_bytes(body: dict) -> bytes:
    """The exact bytes sent and signed (compact, keys sorted)."""
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


async def _call(caller: WebhookCaller, d: asyncpg.Record, now: datetime) -> tuple[CallOutcome, datetime]:
    started = time.monotonic()
    body = json.loads(d["body"]) if isinstance(d["body"], str) else d["body"]
    outcome = await caller.post(d["url"], body_bytes(body), secret=d["secret"], event=d["event"],
                                delivery_id=str(d["id"]), t=int(now.timestamp()))
    return outcome, now + timedelta(seconds=time.monotonic() - started)


async def deliver_due(rt: Runtime, *, now: datetime | None = None, config: BillingSettings) -> int:
    """Call the webhook deliveries due at ``now`` once each and record the outcomes; returns how many were
    called. Safe on several replicas at once (a claimed delivery is leased to its caller)."""
    now = now or utcnow()
    lease_until = now + timedelta(seconds=2 * config.webhook_timeout_s + 1)
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="billing.claim_webhooks") as uow:
        due = await store.claim_due(uow.conn, now, lease_until, BATCH)
    if not due:
        return 0
    async with WebhookCaller(config.webhook_timeout_s, allow_private=config.webhook_allow_private) as caller:
        outcomes = await asyncio.gather(*(_call(caller, d, now) for d in due))
    for d, (outcome, finished) in zip(due, outcomes):
        attempt = after_attempt(d["attempts"], outcome.ok, now=finished, max_attempts=config.webhook_attempts,
                                base_s=config.webhook_backoff_s)
        async with UnitOfWork.begin(rt.pool, rt.outbox, name="billing.webhook_attempt") as uow:
            row = await store.save_attempt(uow.conn, d["id"], attempt, outcome.status, outcome.error, finished)
            if row is not None:
                await uow.emit("billing.webhook_delivery_changed", c.WebhookDeliveryChanged(
                    delivery_id=row["id"], tenant_id=row["tenant_id"], event=row["event"], url=row["url"],
                    status=row["status"], attempts=row["attempts"], last_status=row["last_status"],
                    last_error=row["last_error"], next_attempt_at=row["next_attempt_at"],
                    delivered_at=row["delivered_at"], at=finished),
                    correlation_id=_correlation(row["tenant_id"]), tenant_id=row["tenant_id"])
        log.info("billing.webhook_called", delivery_id=str(d["id"]), tenant_id=str(d["tenant_id"]),
                 status=attempt.status, attempts=attempt.attempts, http_status=outcome.status, error=outcome.error)
    return len(due)

