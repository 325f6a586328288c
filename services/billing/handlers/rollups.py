"""Hourly usage rollups per tenant, for dashboards (STUB: filled in by the metering work)."""
from __future__ import annotations

from shared.unit_of_work import UnitOfWork

from ..domain.usage import UsageRecord


async def usage_recorded(ctx: UnitOfWork, records: list[UsageRecord]) -> None:
    """Publish billing.usage_rolled_up for each (tenant, UTC hour) the new ``records`` changed."""
    return None
