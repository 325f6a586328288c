"""Hourly usage rollups per tenant, for dashboards.

After new usage records are stored (rating.rate_and_record, in its transaction), each (tenant, UTC hour of a
record's period_start) they touched is summed again from ``usage_records`` (GPU-seconds, byte-seconds, rated
amounts per currency, records) and published as ``billing.usage_rolled_up``: the latest event per (tenant,
hour) is current. The sums cannot miss a concurrent writer's records: every transaction that stores usage
appends to the ledger, whose append lock it holds until it commits, so they run one after the other.
"""
from __future__ import annotations

import uuid
from datetime import datetime

from shared.envelope import utcnow
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.repository import hour_totals
from ..domain.usage import UsageRecord, hour_of


def _decimal(d) -> str:
    return format(d, "f")


async def usage_recorded(ctx: UnitOfWork, records: list[UsageRecord]) -> None:
    """Publish billing.usage_rolled_up for each (tenant, UTC hour) the new ``records`` changed (summed in one
    query)."""
    touched: set[tuple[uuid.UUID, datetime]] = {(r.tenant_id, hour_of(r.period_start)) for r in records}
    at = utcnow()
    sums = await hour_totals(ctx.conn, sorted(touched))
    by_tenant: dict[uuid.UUID, list] = {}
    for (tenant_id, hour), t in sums.items():
        by_tenant.setdefault(tenant_id, []).append(("billing.usage_rolled_up", c.UsageRolledUp(
            tenant_id=tenant_id, hour=hour, gpu_seconds=_decimal(t.gpu_seconds), byte_seconds=_decimal(t.byte_seconds),
            amounts=[c.Amount(currency=k, amount_minor=v) for k, v in sorted(t.amounts.items())],
            records=t.records, at=at), None))
    for tenant_id, events in by_tenant.items():   # one outbox write per tenant: the tenant is the envelope's
        await ctx.emit_many(events, correlation_id=f"usage-rollup:{tenant_id}", tenant_id=tenant_id)
