"""Running meters cut into usage while they run, the quoted price, and hourly rollups, against real NATS
JetStream and PostgreSQL (billing started with cut_s=0: the tests cut with an injected clock)."""
from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from services.billing.bootstrap import build
from services.billing.handlers import meters
from shared.wire import step_key
from tests.support.bus import send_command


def _hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def _seconds(d: timedelta) -> Decimal:
    return Decimal(d.days * 86400 + d.seconds) + Decimal(d.microseconds) / 10**6


async def _version(conn, version: str, effective_from: datetime, micros_per_gpu_hour: int) -> None:
    """A version already in force (publishing refuses a past effective_from, so the test writes it)."""
    body = {"version": version, "currency": "USD", "effective_from": effective_from.isoformat(), "spot_discount_bps": 0,
            "gpu_hour": [{"micros_per_gpu_hour": micros_per_gpu_hour}], "gb_hour": {}}
    await conn.execute("INSERT INTO price_list_versions (version, currency, effective_from, body, published_by) "
                       "VALUES ($1, 'USD', $2, $3::jsonb, $4)", version, effective_from, json.dumps(body), uuid.uuid4())


async def _meter(conn, started_at: datetime, gpus: int = 2) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    meter, alloc, tenant = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await conn.execute("INSERT INTO meters (id, allocation_id, tenant_id, shape, gpu_count, started_at, gpu_model, pool) "
                       "VALUES ($1,$2,$3,'vm.2gpu',$4,$5,'H100','shared')", meter, alloc, tenant, gpus, started_at)
    return meter, alloc, tenant


def _step(alloc: uuid.UUID, tenant: uuid.UUID, step: str, **extra) -> dict:
    saga = uuid.uuid4()
    return {"saga_id": saga, "step": step, "idempotency_key": step_key(saga, step), "allocation_id": alloc,
            "tenant_id": tenant, **extra}


@pytest.fixture
async def billing(run_service):
    """Billing with one price list (3.60 USD per GPU-hour since yesterday) and no background cuts."""
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, cut_s=0))
    async with rt.pool.acquire() as conn:
        await conn.execute("DELETE FROM price_list_versions")
        await _version(conn, f"m-{uuid.uuid4().hex[:6]}", _hour(datetime.now(UTC)) - timedelta(days=1),
                       3_600_000)
    return rt


async def _records(rt, tenant: uuid.UUID) -> list:
    async with rt.pool.acquire() as conn:
        return await conn.fetch("SELECT * FROM usage_records WHERE tenant_id=$1 ORDER BY period_start", tenant)


async def _stop(rt, nc, watch, alloc, tenant) -> datetime:
    stopped = await watch("billing.evt.meter_stopped")
    await send_command(nc.jetstream(), "billing.stop_meter", _step(alloc, tenant, "stop_meter"))
    await stopped.wait_for(lambda i: i[1]["data"]["allocation_id"] == str(alloc))
    async with rt.pool.acquire() as conn:
        return await conn.fetchval("SELECT stopped_at FROM meters WHERE allocation_id=$1", alloc)


async def test_a_meter_cut_twice_then_stopped_is_recorded_from_start_to_stop_without_gap_or_overlap(billing, nc, watch):
    now = datetime.now(UTC)
    start = _hour(now) - timedelta(hours=2) + timedelta(minutes=20, microseconds=123)
    meter, alloc, tenant = await _meter(billing.pool, start)
    first, second = start + timedelta(minutes=30), _hour(now) - timedelta(minutes=30)
    assert await meters.cut(billing, now=first) >= 1
    assert [r["period_end"] for r in await _records(billing, tenant)] == [first]     # usage while it runs
    await meters.cut(billing, now=second)
    stopped_at = await _stop(billing, nc, watch, alloc, tenant)
    rows = await _records(billing, tenant)
    assert [(r["period_start"], r["period_end"]) for r in rows] == [
        (start, first), (first, _hour(now) - timedelta(hours=1)), (_hour(now) - timedelta(hours=1), second),
        (second, _hour(now)), (_hour(now), stopped_at)]
    assert [r["event_id"] for r in rows] == [f"{meter}@{r['period_start'].isoformat()}" for r in rows]
    assert sum(r["quantity"] for r in rows) == 2 * _seconds(stopped_at - start)        # GPUs × seconds, exact
    async with billing.pool.acquire() as conn:
        assert await conn.fetchval("SELECT cut_until FROM meters WHERE id=$1", meter) == stopped_at
        assert await conn.fetchval("SELECT count(*) FROM ledger_entries WHERE tenant_id=$1", tenant) == len(rows)


async def test_a_redelivered_stop_and_a_repeated_cut_record_nothing_new(billing, nc, watch):
    start = _hour(datetime.now(UTC)) - timedelta(minutes=50)   # the first cut stays in one UTC hour
    meter, alloc, tenant = await _meter(billing.pool, start)
    cut_at = start + timedelta(minutes=10)
    await meters.cut(billing, now=cut_at)
    await meters.cut(billing, now=cut_at)                                  # the same cut again (another replica)
    assert len(await _records(billing, tenant)) == len({r["event_id"] for r in await _records(billing, tenant)})
    before = [r["event_id"] for r in await _records(billing, tenant)]
    assert before == [f"{meter}@{start.isoformat()}"]
    await _stop(billing, nc, watch, alloc, tenant)
    after_stop = await _records(billing, tenant)
    await _stop(billing, nc, watch, alloc, tenant)                         # a second stop (another saga key)
    await meters.cut(billing)                                              # a cut after the stop
    again = await _records(billing, tenant)
    assert [r["event_id"] for r in again] == [r["event_id"] for r in after_stop] and len(again) > len(before)
    async with billing.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM ledger_entries WHERE tenant_id=$1", tenant) == len(again)


async def test_the_quoted_price_rates_usage_even_after_a_new_price_list_version_takes_effect(billing, nc, watch):
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    quote = {"price_list_version": "quoted-1", "currency": "USD", "micros_per_gpu_hour": 1_800_000,
             "spot_discount_bps": 0, "spot": False, "sku_id": "gpu-hour:model=H100", "gpu_count": 2,
             "hourly_amount": "3.6", "quoted_at": datetime.now(UTC).isoformat()}
    started = await watch("billing.evt.meter_started")
    await send_command(nc.jetstream(), "billing.start_meter",
                       _step(alloc, tenant, "start_meter", shape="vm.2gpu", gpu_count=2, gpu_model="H100", price=quote))
    await started.wait_for(lambda i: i[1]["data"]["allocation_id"] == str(alloc))
    now = datetime.now(UTC)
    async with billing.pool.acquire() as conn:   # history: it has run since 90 minutes ago; 9.00 USD/h since 1 h
        await conn.execute("UPDATE meters SET started_at=$2 WHERE allocation_id=$1", alloc, now - timedelta(minutes=90))
        await _version(conn, f"newer-{uuid.uuid4().hex[:6]}", now - timedelta(hours=1), 9_000_000)
    await meters.cut(billing, now=now - timedelta(minutes=30))
    await _stop(billing, nc, watch, alloc, tenant)
    rows = await _records(billing, tenant)
    assert len(rows) >= 2 and {r["price_version"] for r in rows} == {"quoted-1"}
    assert {r["sku_price_id"] for r in rows} == {"gpu-hour:model=H100@quoted-1"}
    seconds = sum(r["quantity"] for r in rows)                               # GPU-seconds at 1.80 USD/h
    assert abs(sum(r["amount_minor"] for r in rows) - seconds * 180 / 3600) <= len(rows)


async def test_rollup_events_carry_the_tenant_hour_totals(billing, nc, watch):
    now = datetime.now(UTC)
    hour = _hour(now) - timedelta(hours=2)
    _, alloc, tenant = await _meter(billing.pool, hour + timedelta(minutes=20))
    rollups = await watch("billing.evt.usage_rolled_up")
    await meters.cut(billing, now=hour + timedelta(minutes=50))
    await meters.cut(billing, now=hour + timedelta(minutes=80))             # completes the hour, opens the next
    mine = lambda h, n: lambda i: (i[1]["data"]["tenant_id"] == str(tenant)  # noqa: E731
                                   and datetime.fromisoformat(i[1]["data"]["hour"]) == h and i[1]["data"]["records"] == n)
    [(_, env, _)] = await rollups.wait_for(mine(hour, 2))
    data = env["data"]
    assert Decimal(data["gpu_seconds"]) == 2 * 40 * 60 and Decimal(data["byte_seconds"]) == 0
    assert data["amounts"] == [{"currency": "USD", "amount_minor": 480}]     # 2 GPUs × 40 min × 3.60 USD/h
    assert env["tenant_id"] == str(tenant)
    [(_, nxt, _)] = await rollups.wait_for(mine(hour + timedelta(hours=1), 1))
    assert Decimal(nxt["data"]["gpu_seconds"]) == 2 * 20 * 60 and nxt["data"]["amounts"][0]["amount_minor"] == 240
