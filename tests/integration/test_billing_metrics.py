"""Billing's counters on /metrics move with what it committed: each usage record rated and charged once
(against real NATS JetStream and PostgreSQL)."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from services.billing.adapters.metrics import CHARGED, USAGE_RATED
from services.billing.bootstrap import build
from tests.integration.test_billing_rating import _hour, _meter, _stop, _version
from tests.support.bus import send_command
from tests.support.polling import eventually


@pytest.fixture
async def billing(run_service):
    """Billing with only the price list this test writes."""
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, cut_s=0))
    async with rt.pool.acquire() as conn:
        await conn.execute("DELETE FROM price_list_versions")
    return rt


def _counted() -> tuple[float, float]:
    rated = sum(s.value for m in USAGE_RATED.collect() for s in m.samples if s.name.endswith("_total"))
    return rated, CHARGED.labels("USD")._value.get()


async def test_each_rated_record_counts_once_with_its_amount(billing, nc):
    now = datetime.now(UTC)
    async with billing.pool.acquire() as conn:
        await _version(conn, "it-metrics", _hour(now) - timedelta(days=1), 3_600_000, gpu_model="H100")
        alloc, tenant = await _meter(conn, now - timedelta(minutes=90))
    before = _counted()
    await send_command(nc.jetstream(), "billing.stop_meter", _stop(alloc, tenant, uuid.uuid4()))

    async def stored():
        async with billing.pool.acquire() as conn:
            return await conn.fetch("SELECT amount_minor FROM usage_records WHERE tenant_id=$1", tenant) or None
    rows = await eventually(stored, timeout=20)
    expected = (before[0] + len(rows), before[1] + sum(r["amount_minor"] for r in rows))
    await eventually(_counted, until=lambda c: c == expected, timeout=5)   # counted after the commit
    assert len(rows) >= 2
