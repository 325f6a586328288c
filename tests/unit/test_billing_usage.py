"""Billing's metering and rating rules (services/billing/domain/usage.py): pure, exact."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from services.billing.domain.model import Meter, QuotedPrice
from services.billing.domain.pricing import GpuHourPrice, PriceList, PriceListVersion
from services.billing.domain.usage import hours_between, meter_records, rate, storage_record, version_from_doc

T0 = datetime(2026, 1, 1, 10, 30, tzinfo=UTC)


def _running(start: datetime, **kw) -> Meter:
    return Meter(uuid.UUID(int=1), uuid.UUID(int=2), uuid.UUID(int=3), "vm.2gpu", 2, start,
                 gpu_model=kw.get("gpu_model", "H100"), pool="shared", spot=kw.get("spot", False),
                 cut_until=kw.get("cut_until"), price=kw.get("price"))


def _meter(start: datetime, stop: datetime, **kw):
    return meter_records(_running(start, **kw), stop)


def _prices(*versions) -> PriceList:
    return PriceList("tessera", versions)


def test_a_meter_is_split_at_utc_hours_and_keyed_by_piece_start():
    records = _meter(T0, T0 + timedelta(hours=2, seconds=1))
    assert [(r.period_start.hour, r.period_start.minute) for r in records] == [(10, 30), (11, 0), (12, 0)]
    assert [r.quantity for r in records] == [3600, 7200, Fraction(3602)]
    assert sum(r.quantity for r in records) == 2 * (2 * 3600 + 1)
    assert [r.key for r in records] == [f"meter:{uuid.UUID(int=1)}@{t.isoformat()}" for t in
                                        (T0, T0.replace(hour=11, minute=0), T0.replace(hour=12, minute=0))]
    assert [r.key for r in records] == [r.key for r in _meter(T0, T0 + timedelta(hours=2, seconds=1))]
    assert hours_between(T0, T0) == []


def test_a_cut_meter_records_only_what_follows_its_last_cut_without_gap_or_overlap():
    cut_at = T0 + timedelta(minutes=20, seconds=7)                        # 10:50:07
    first = _meter(T0, cut_at)
    rest = meter_records(_running(T0, cut_until=cut_at), T0 + timedelta(minutes=35))   # until 11:05
    assert [r.key for r in rest] == [f"meter:{uuid.UUID(int=1)}@{cut_at.isoformat()}",
                                     f"meter:{uuid.UUID(int=1)}@{T0.replace(hour=11, minute=0).isoformat()}"]
    pieces = [(r.period_start, r.period_end) for r in first + rest]
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert sum(r.quantity for r in first + rest) == 2 * 35 * 60           # 10:30 → 11:05, 2 GPUs
    assert meter_records(_running(T0, cut_until=cut_at), cut_at) == []     # a repeated cut records nothing


def test_pieces_of_one_hour_sum_to_the_hour_rated_once_whatever_the_cuts():
    v = PriceListVersion("v", "USD", T0 - timedelta(days=1), (GpuHourPrice(2_500_000),))   # 2.50 per GPU-hour
    hour = T0.replace(minute=0)
    whole = rate(_meter(hour, hour + timedelta(hours=1))[0], _prices(v)).amount_minor
    pieces, meter = [], _running(hour)
    for minute in range(1, 61):                  # cut every minute: each minute alone would round 8.33 to 8
        until = hour + timedelta(minutes=minute)
        pieces += meter_records(meter, until)
        meter.cut_until = until
    assert whole == 500 and sum(rate(r, _prices(v)).amount_minor for r in pieces) == 500


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


SNAPSHOT = QuotedPrice("quoted-v1", "USD", 3_600_000, 2500, False, "gpu-hour:model=H100", T0 - timedelta(days=1))


def test_a_quoted_price_rates_gpu_usage_even_after_a_new_version_takes_effect():
    newer = PriceListVersion("v9", "EUR", T0 - timedelta(hours=1), (GpuHourPrice(99_000_000),))
    [r] = _meter(T0, T0 + timedelta(minutes=30), price=SNAPSHOT)
    rating = rate(r, _prices(newer))
    assert (rating.price_version, rating.currency, rating.amount_minor) == ("quoted-v1", "USD", 360)
    assert rating.sku_price_id == "gpu-hour:model=H100@quoted-v1"
    assert (rating.list_amount_minor, rating.micros_per_unit_hour) == (360, 3_600_000)


def test_a_quoted_spot_price_gets_its_discount_and_reports_the_list_amount():
    spot = QuotedPrice("quoted-v1", "USD", 3_600_000, 2500, True, "gpu-hour:default")
    [r] = _meter(T0, T0 + timedelta(minutes=30), price=spot)
    rating = rate(r, _prices())
    assert (rating.amount_minor, rating.list_amount_minor, rating.sku_price_id) == (
        270, 360, "gpu-hour:default@quoted-v1:spot")


def test_list_amount_of_spot_usage_on_the_price_list_is_the_undiscounted_amount():
    v = PriceListVersion("v", "USD", T0 - timedelta(days=1), (GpuHourPrice(3_600_000),), spot_discount_bps=2500,
                         gb_hour={"standard": 100_000})
    [r] = _meter(T0, T0 + timedelta(minutes=30), spot=True)
    rating = rate(r, _prices(v))
    assert (rating.amount_minor, rating.list_amount_minor, rating.micros_per_unit_hour) == (270, 360, 3_600_000)
    storage = storage_record(volume_id=uuid.UUID(int=9), tenant_id=uuid.UUID(int=3), user_id=None,
                             storage_class="standard", used_bytes=10**9, since=T0, until=T0 + timedelta(hours=1))
    s = rate(storage, _prices(v))
    assert (s.amount_minor, s.list_amount_minor, s.micros_per_unit_hour) == (10, 10, 100_000)
    none = rate(storage, _prices())
    assert (none.rated, none.list_amount_minor, none.micros_per_unit_hour) == (False, 0, None)
