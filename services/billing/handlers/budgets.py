"""Budgets, thresholds and their webhooks (STUB: filled in by the budgets work)."""
from __future__ import annotations

import uuid

from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..settings import BillingSettings


async def set_budget(ctx: UnitOfWork, cmd: c.SetBudget) -> None:
    return None


async def delete_budget(ctx: UnitOfWork, cmd: c.DeleteBudget) -> None:
    return None


async def usage_recorded(ctx: UnitOfWork, tenant_ids: list[uuid.UUID]) -> None:
    """After new usage of these tenants is rated (caller's transaction): check their budgets' thresholds."""
    return None


async def deliver_forever(rt: Runtime, config: BillingSettings) -> None:
    """Call the webhooks due every ``config.webhook_tick_s`` (until cancelled)."""
    return None
