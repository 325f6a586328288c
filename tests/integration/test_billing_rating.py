"""Billing's metering → rating → ledger and its price lists, against real NATS JetStream and PostgreSQL."""
from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import pytest

from services.billing.adapters.ledger import PgLedger
from services.billing.adapters.metrics import CHARGED, USAGE_RATED
from services.billing.adapters.repository import HOUR_TOTALS, hour_totals
from services.billing.bootstrap import build
from services.billing.domain.usage import UsageRecord
from services.billing.handlers import rating
from shared.unit_of_work import UnitOfWork
from shared.wire import step_key
from tests.support.bus import make_envelope, publish_envelope, send_command
from tests.support.polling import eventually


def _hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


async def _version(conn, version: str, effective_from: datetime, micros_per_gpu_hour: int, **gpu) -> None:
    """A version already in force (history: publishing refuses a past effective_from, so tests write it)."""
    body = {"version": version, "currency": "USD", "effective_from": effective_from.isoformat(), "spot_discount_bps": 0,
            "gpu_hour": [{"micros_per_gpu_hour": micros_per_gpu_hour, **gpu}], "gb_hour": {"standard": 100_000}}
    await conn.execute("INSERT INTO price_list_versions (version, currency, effective_from, body, published_by) "
                       "VALUES ($1, 'USD', $2, $3::jsonb, $4)", version, effective_from, json.dumps(body), uuid.uuid4())


async def _meter(conn, started_at: datetime, *, gpus: int = 2, gpu_model: str = "H100") -> tuple[uuid.UUID, uuid.UUID]:
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    await conn.execute("INSERT INTO meters (id, allocation_id, tenant_id, shape, gpu_count, started_at, user_id, "
                       "gpu_model, pool, spot) VALUES ($1,$2,$3,'vm.2gpu',$4,$5,$6,$7,'shared',false)",
                       uuid.uuid4(), alloc, tenant, gpus, started_at, uuid.uuid4(), gpu_model)
    return alloc, tenant


def _stop(alloc: uuid.UUID, tenant: uuid.UUID, saga: uuid.UUID) -> dict:
    return {"saga_id": saga, "step": "stop_meter", "idempotency_key": step_key(saga, "stop_meter"),
            "allocation_id": alloc, "tenant_id": tenant}


@pytest.fixture
async def billing(run_service):
    """Billing with no price list (each test writes the versions it needs; usage and the ledger stay)."""
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, cut_s=0))
    async with rt.pool.acquire() as conn:
        await conn.execute("DELETE FROM price_list_versions")
    return rt


async def test_a_redelivered_stop_counts_once_in_usage_and_ledger_rated_per_version_in_force(billing, nc, watch):
    now = datetime.now(UTC)
    start = _hour(now) - timedelta(hours=2) + timedelta(minutes=30)     # runs in three UTC hours
    async with billing.pool.acquire() as conn:
        await _version(conn, "it-v1", _hour(now) - timedelta(days=1), 3_600_000, gpu_model="H100")   # 3.60 USD/GPU-h
        await _version(conn, "it-v2", _hour(now) - timedelta(hours=1), 7_200_000, gpu_model="H100")  # 7.20 from then
        alloc, tenant = await _meter(conn, start)
    rated = await watch("billing.evt.usage_rated")
    stopped = await watch("billing.evt.meter_stopped")
    js = nc.jetstream()
    env, _ = await send_command(js, "billing.stop_meter", _stop(alloc, tenant, uuid.uuid4()))
    await send_command(js, "billing.stop_meter", {}, env=env, msg_id=f"again-{env.id}")       # redelivered
    await send_command(js, "billing.stop_meter", _stop(alloc, tenant, uuid.uuid4()))           # a second key
    mine = [lambda i: i[1]["data"]["allocation_id"] == str(alloc)]
    await stopped.wait_for(lambda i: mine[0](i) and len([j for j in stopped.items if mine[0](j)]) >= 2)  # both keys
    hits = await rated.wait_for(lambda i: i[1]["data"]["tenant_id"] == str(tenant))
    async with billing.pool.acquire() as conn:
        rows = await conn.fetch("SELECT * FROM usage_records WHERE tenant_id=$1 ORDER BY period_start", tenant)
        ledger = await conn.fetch("SELECT * FROM ledger_entries WHERE tenant_id=$1", tenant)
        stopped_at = await conn.fetchval("SELECT stopped_at FROM meters WHERE allocation_id=$1", alloc)
    assert len(rows) == len(ledger) == len({i[1]["data"]["usage_key"] for i in hits}) >= 3
    # each hour is rated with the version in force at its start: v1 until an hour ago, v2 since
    assert [r["price_version"] for r in rows] == ["it-v1"] + ["it-v2"] * (len(rows) - 1)
    assert rows[0]["quantity"] == 2 * 30 * 60 and rows[0]["amount_minor"] == 360   # 2 GPUs × 30 min × 3.60
    assert float(sum(r["quantity"] for r in rows)) == pytest.approx(2 * (stopped_at - start).total_seconds())
    for r in rows[1:]:   # 7.20 USD per GPU-hour, in cents, rounded once per record
        assert r["amount_minor"] == round(float(r["quantity"]) * 720 / 3600)
    assert {e["source_event"] for e in ledger} == {f"{r['source']}:{r['event_id']}" for r in rows}
    async with billing.pool.acquire() as conn:
        assert (await PgLedger(conn).verify()).ok


async def test_usage_before_any_version_is_recorded_unrated_with_its_reason(billing, nc, watch):
    async with billing.pool.acquire() as conn:
        alloc, tenant = await _meter(conn, datetime.now(UTC) - timedelta(minutes=5))
    rated = await watch("billing.evt.usage_rated")
    await send_command(nc.jetstream(), "billing.stop_meter", _stop(alloc, tenant, uuid.uuid4()))
    hit = (await rated.wait_for(lambda i: i[1]["data"]["tenant_id"] == str(tenant)))[0][1]["data"]
    assert (hit["rated"], hit["amount_minor"], hit["currency"]) == (False, 0, "XXX")
    assert "no tessera price list version is in force" in hit["reason"]


async def test_an_effective_price_list_cannot_change_and_the_refusal_is_published(billing, nc, watch):
    events = await watch("billing.evt.>")
    version = f"v-{uuid.uuid4().hex[:8]}"
    admin = uuid.uuid4()
    soon = datetime.now(UTC) + timedelta(seconds=1)
    doc = {"version": version, "currency": "EUR", "effective_from": soon.isoformat(), "spot_discount_bps": 3000,
           "gpu_hour": [{"micros_per_gpu_hour": 2_000_000}], "gb_hour": {}, "requested_by": admin}
    await send_command(nc.jetstream(), "billing.publish_price_list", doc)
    await events.wait_for(lambda i: i[1]["type"] == "billing.price_list_published" and i[1]["data"]["version"] == version)
    async with billing.pool.acquire() as conn:   # now it is in force: make it effective without waiting for it
        await conn.execute("UPDATE price_list_versions SET effective_from = effective_from - interval '1 hour', "
                           "body = jsonb_set(body, '{effective_from}', to_jsonb((effective_from - interval '1 hour')::text)) "
                           "WHERE version=$1", version)
    changed = {**doc, "effective_from": (soon + timedelta(days=1)).isoformat(),
               "gpu_hour": [{"micros_per_gpu_hour": 1}]}
    await send_command(nc.jetstream(), "billing.publish_price_list", changed)
    hit = await events.wait_for(lambda i: i[1]["type"] == "billing.price_list_rejected" and i[1]["data"]["version"] == version)
    assert "effective since" in hit[0][1]["data"]["reason"]
    async with billing.pool.acquire() as conn:
        body = json.loads(await conn.fetchval("SELECT body FROM price_list_versions WHERE version=$1", version))
    assert body["gpu_hour"] == [{"micros_per_gpu_hour": 2_000_000, "shape": None, "gpu_model": None, "pool": None}]


async def test_a_checkpoint_covers_the_ledger_and_is_published(billing, nc, watch):
    async with billing.pool.acquire() as conn:
        alloc, tenant = await _meter(conn, datetime.now(UTC) - timedelta(minutes=1))
    rated = await watch("billing.evt.usage_rated")
    checkpoints = await watch("billing.evt.ledger_checkpointed")
    await send_command(nc.jetstream(), "billing.stop_meter", _stop(alloc, tenant, uuid.uuid4()))
    await rated.wait_for(lambda i: i[1]["data"]["tenant_id"] == str(tenant))
    event = await rating.checkpoint(billing)
    async with billing.pool.acquire() as conn:
        head = await conn.fetchval("SELECT max(seq) FROM ledger_entries")
        assert (await PgLedger(conn).verify()).ok
    assert event is not None and event.last_seq == head
    hit = await checkpoints.wait_for(lambda i: i[1]["data"]["last_seq"] == head)
    assert hit[0][1]["data"]["root_hash"] == event.root_hash


async def test_storage_reports_bill_the_bytes_held_between_them_once(billing, nc, watch):
    tenant, volume = uuid.uuid4(), uuid.uuid4()
    t0 = datetime.now(UTC) - timedelta(minutes=10)
    rated = await watch("billing.evt.usage_rated")
    js = nc.jetstream()
    first = {"tenant_id": tenant, "volumes": [{"volume_id": volume, "used_bytes": 10**9, "limit_bytes": 0}], "at": t0}
    later = {**first, "at": t0 + timedelta(hours=1)}
    await send_command(js, "storage.usage_reported", first)
    # reports are consumed by several workers: the next is sent once the first is in (an older report that
    # arrives after a newer one is dropped, see handlers.rating.on_usage_reported)
    async with billing.pool.acquire() as conn:
        await eventually(lambda: conn.fetchval("SELECT last_report_at FROM storage_volumes WHERE volume_id=$1", volume),
                         timeout=20, what="the first report to be handled")
    await send_command(js, "storage.usage_reported", later)
    await publish_envelope(js, "storage.evt.usage_reported", make_envelope("storage.usage_reported", later))   # replayed
    hit = await rated.wait_for(lambda i: i[1]["data"]["tenant_id"] == str(tenant))
    assert hit[0][1]["data"]["quantity"] == str(10**9 * 3600) and hit[0][1]["data"]["kind"] == "storage"
    async with billing.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM usage_records WHERE tenant_id=$1", tenant) == 1


# billing's counters on /metrics move with what it committed: each usage record rated and charged once
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


# --- plans that do not grow with the tables ----------------------------------------------------------------------
async def test_a_rating_transaction_plans_the_ledger_lookup_for_its_keys_each_time(billing):
    """A connection that rated a few batches while the ledger was small keeps no plan made for it then: the
    ledger's idempotency read is planned for its keys in every rating transaction."""
    now = datetime.now(UTC)
    async with billing.pool.acquire() as conn:
        await _version(conn, "it-plans", _hour(now) - timedelta(days=1), 3_600_000, gpu_model="H100")
        tenant = uuid.uuid4()
        for batch in range(8):   # more than the five runs after which PostgreSQL may keep a generic plan
            records = [UsageRecord("meter", f"plans-{uuid.uuid4()}@{batch}", "gpu", tenant, now - timedelta(hours=2),
                                   now - timedelta(hours=1), Fraction(3600), allocation_id=uuid.uuid4(),
                                   shape="vm.1gpu", gpu_model="H100", pool="shared", gpu_count=1) for _ in range(20)]
            async with conn.transaction():
                uow = UnitOfWork(conn, billing.outbox, name="test.plans", defer=True)
                assert await rating.rate_and_record(uow, records, correlation_id="test-plans") == 20
                await uow.flush()
        plans = await conn.fetchrow("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                                    "WHERE statement LIKE '(SELECT true AS head%ledger_entries%'")
    assert plans["custom_plans"] >= 8 and plans["generic_plans"] == 0, dict(plans)


async def test_hour_totals_read_usage_through_its_index_before_any_statistics(billing):
    """The rollups' sums are planned as index lookups per (tenant, hour) on a table with no statistics (a
    temporary copy: never analyzed), where a join of the pairs with the table is a scan of all of it."""
    async with billing.pool.acquire() as conn, conn.transaction():
        await conn.execute("CREATE TEMP TABLE usage_records (LIKE billing.usage_records INCLUDING ALL) ON COMMIT DROP")
        await conn.execute(
            "INSERT INTO pg_temp.usage_records (source, event_id, kind, tenant_id, period_start, period_end, quantity, "
            "amount_minor, currency, rated, ledger_seq) SELECT 'meter', 'e' || i, 'gpu', gen_random_uuid(), "
            "now() - i * interval '1 minute', now(), 3600, 1, 'USD', true, i FROM generate_series(1, 30000) i")
        pairs = await conn.fetch("SELECT tenant_id, date_trunc('hour', period_start) AS hour FROM pg_temp.usage_records "
                                 "ORDER BY event_id LIMIT 60")
        [plan] = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) " + HOUR_TOTALS, [p["tenant_id"] for p in pairs],
                                                [p["hour"] for p in pairs]))
        totals = await hour_totals(conn, [(p["tenant_id"], p["hour"]) for p in pairs])

    def scans(node):
        yield node["Node Type"], node.get("Relation Name")
        for child in node.get("Plans", []):
            yield from scans(child)
    assert ("Seq Scan", "usage_records") not in set(scans(plan["Plan"])), plan
    assert len(totals) == 60 and all(t.records == 1 and t.gpu_seconds == 3600 for t in totals.values())
