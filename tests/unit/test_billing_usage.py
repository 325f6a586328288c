"""Billing's metering and rating rules (services/billing/domain/usage.py): pure, exact."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from fractions import Fraction

from services.billing.domain.pricing import GpuHourPrice, PriceList, PriceListVersion
from services.billing.domain.usage import hours_between, meter_records, rate, storage_record, version_from_doc

T0 = datetime(2026, 1, 1, 10, 30, tzinfo=timezone.utc)


def _meter(start: datetime, stop: datetime, **kw):
    return meter_records(meter_id=uuid.UUID(int=1), allocation_id=uuid.UUID(int=2), tenant_id=uuid.UUID(int=3),
                         user_id=None, shape="vm.2gpu", gpu_model=kw.get("gpu_model", "H100"), pool="shared",
                         spot=kw.get("spot", False), gpu_count=2, started_at=start, stopped_at=stop)


def _prices(*versions) -> PriceList:
    return PriceList("tessera", versions)


def test_a_meter_is_split_at_utc_hours_and_its_keys_are_stable():
    records = _meter(T0, T0 + timedelta(hours=2, seconds=1))
    assert [(r.period_start.hour, r.period_start.minute) for r in records] == [(10, 30), (11, 0), (12, 0)]
    assert [r.quantity for r in records] == [3600, 7200, Fraction(3602)]
    assert sum(r.quantity for r in records) == 2 * (2 * 3600 + 1)
    assert [r.key for r in records] == [r.key for r in _meter(T0, T0 + timedelta(hours=2, seconds=1))]
    assert hours_between(T0, T0) == []


def test_each_hour_is_rated_with_the_version_in_force_at_its_start():
    v1 = PriceListVersion("v1", "USD", T0 - timedelta(days=1), (GpuHourPrice(3_600_000),))
    v2 = PriceListVersion("v2", "USD", T0 + timedelta(minutes=15), (GpuHourPrice(7_200_000, gpu_model="H100"),))
    ratings = [rate(r, _prices(v1, v2)) for r in _meter(T0, T0 + timedelta(hours=1, minutes=30))]
    # 10:30-11:00 under v1 (2 GPUs × 30 min × 3.60; v2 came at 10:45: from the next hour), 11:00-12:00 under v2
    assert [(x.price_version, x.amount_minor, x.currency) for x in ratings] == [("v1", 360, "USD"), ("v2", 1440, "USD")]


def test_spot_usage_gets_the_versions_discount():
    v = PriceListVersion("v", "USD", T0 - timedelta(days=1), (GpuHourPrice(3_600_000),), spot_discount_bps=2500)
    [r] = _meter(T0, T0 + timedelta(minutes=30), spot=True)
    assert rate(r, _prices(v)).amount_minor == 270


def test_usage_with_no_version_in_force_is_unrated_with_the_reason():
    v = PriceListVersion("v", "USD", T0 + timedelta(days=1), (GpuHourPrice(1),))
    [r] = _meter(T0, T0 + timedelta(minutes=1))
    rating = rate(r, _prices(v))
    assert (rating.rated, rating.amount_minor, rating.currency) == (False, 0, "XXX")
    assert "no tessera price list version is in force" in rating.reason


def test_storage_bills_bytes_held_since_the_previous_report():
    r = storage_record(volume_id=uuid.UUID(int=9), tenant_id=uuid.UUID(int=3), user_id=None, storage_class="standard",
                       used_bytes=2 * 10**9, since=T0, until=T0 + timedelta(hours=3))
    v = PriceListVersion("v", "USD", T0 - timedelta(days=1), gb_hour={"standard": 100_000})   # 0.10 USD per GB-hour
    assert r.quantity_text == str(2 * 10**9 * 3 * 3600) and rate(r, _prices(v)).amount_minor == 60
    assert storage_record(volume_id=uuid.UUID(int=9), tenant_id=uuid.UUID(int=3), user_id=None, storage_class=None,
                          used_bytes=1, since=T0, until=T0) is None
    unknown = storage_record(volume_id=uuid.UUID(int=9), tenant_id=uuid.UUID(int=3), user_id=None, storage_class=None,
                             used_bytes=1, since=T0, until=T0 + timedelta(hours=1))
    assert not rate(unknown, _prices(v)).rated


def test_a_wire_document_becomes_a_validated_version():
    doc = {"version": "v", "currency": "EUR", "effective_from": T0, "spot_discount_bps": 10,
           "gpu_hour": [{"micros_per_gpu_hour": 5, "shape": "vm.2gpu"}], "gb_hour": {"fast": 7}}
    v = version_from_doc(doc)
    assert (v.currency, v.gpu_hour[0].shape, dict(v.gb_hour)) == ("EUR", "vm.2gpu", {"fast": 7})
