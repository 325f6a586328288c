"""Hourly usage rollups per tenant, for dashboards.

After new usage records are stored (rating.rate_and_record, in its transaction), each (tenant, UTC hour of a
record's period_start) they touched is summed again from ``usage_records`` (GPU-seconds, byte-seconds, rated
amounts per currency, records; rating has the statement that stores the records return them: ``touched`` and
adapters.rating.record_usage) and published as ``billing.usage_rolled_up``: the latest event per (tenant,
hour) is current. The sums cannot miss a concurrent writer's records: every transaction that stores usage
appends to the ledger, whose append lock it holds until it commits, so they run one after the other.
"""
from __future__ import annotations

import uuid
from datetime import datetime

from shared.envelope import utcnow
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.repository import HourTotals, hour_totals
from ..domain.usage import UsageRecord, hour_of


def _decimal(d) -> str:
    return format(d, "f")


def touched(records: list[UsageRecord]) -> list[tuple[uuid.UUID, datetime]]:
    """The (tenant, UTC hour) pairs the ``records`` count in, each once, in order."""
    return sorted({(r.tenant_id, hour_of(r.period_start)) for r in records})


async def usage_recorded(ctx: UnitOfWork, records: list[UsageRecord], *,
                         sums: dict[tuple[uuid.UUID, datetime], HourTotals] | None = None) -> None:
    """Publish billing.usage_rolled_up for each (tenant, UTC hour) the new ``records`` changed: ``sums``, the
    totals of ``touched(records)`` read once the records were stored, else summed now in one query."""
    at = utcnow()
    if sums is None:
        sums = await hour_totals(ctx.conn, touched(records))
    by_tenant: dict[uuid.UUID, list] = {}
    for (tenant_id, hour), t in sums.items():
        by_tenant.setdefault(tenant_id, []).append(("billing.usage_rolled_up", c.UsageRolledUp(
            tenant_id=tenant_id, hour=hour, gpu_seconds=_decimal(t.gpu_seconds), byte_seconds=_decimal(t.byte_seconds),
            amounts=[c.Amount(currency=k, amount_minor=v) for k, v in sorted(t.amounts.items())],
            records=t.records, at=at), None))
    for tenant_id, events in by_tenant.items():   # one outbox write per tenant: the tenant is the envelope's
        await ctx.emit_many(events, correlation_id=f"usage-rollup:{tenant_id}", tenant_id=tenant_id)
