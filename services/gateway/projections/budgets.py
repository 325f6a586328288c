"""Budgets, threshold crossings and webhook deliveries as billing publishes them (STUB: budgets work)."""
from __future__ import annotations

from services.billing import contracts as bc
from shared.unit_of_work import UnitOfWork


async def on_budget_changed(ctx: UnitOfWork, data: bc.BudgetChanged) -> None:
    return None


async def on_threshold_crossed(ctx: UnitOfWork, data: bc.BudgetThresholdCrossed) -> None:
    return None


async def on_webhook_delivery_changed(ctx: UnitOfWork, data: bc.WebhookDeliveryChanged) -> None:
    return None
