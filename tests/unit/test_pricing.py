"""Price lists and rating: precedence, versions in force, immutability, spot, exact rounding, validation."""
from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest

from services.billing.domain.pricing import (
    GpuHourPrice,
    ImmutableVersionError,
    NoPriceError,
    PriceList,
    PriceListVersion,
    PricingError,
    StoragePrice,
    UnitPrice,
    currency_exponent,
    hourly_price,
    price_for,
    rate_gpu,
    rate_storage,
    round_half_even,
    storage_price_for,
)

UTC = UTC
T0 = datetime(2026, 11, 1, tzinfo=UTC)
CENT = 10_000          # micros per cent (USD)

PRICES = (
    GpuHourPrice(100 * CENT),                                  # default
    GpuHourPrice(150 * CENT, pool="eu-1"),
    GpuHourPrice(200 * CENT, gpu_model="H100"),
    GpuHourPrice(250 * CENT, gpu_model="H100", pool="eu-1"),
    GpuHourPrice(300 * CENT, shape="gpu.8xh100"),
)


def version(vid="v1", at=T0, prices=PRICES, **kw) -> PriceListVersion:
    kw.setdefault("gb_hour", {"standard": 140, "fast": 500})
    kw.setdefault("spot_discount_bps", 3000)
    return PriceListVersion(vid, kw.pop("currency", "USD"), at, prices, **kw)


def unit(micros: int, *, currency="USD", spot=False, bps=0) -> UnitPrice:
    return UnitPrice("v1", currency, micros, bps, spot, "gpu-hour:default")


@pytest.fixture
def plist() -> PriceList:
    return PriceList("tessera", (version(),))


# -- precedence: shape > model+pool > model > pool > default ---------------------------------------------

@pytest.mark.parametrize("shape, model, pool, expected", [
    ("gpu.8xh100", "H100", "eu-1", 300 * CENT),      # shape beats everything
    ("gpu.other", "H100", "eu-1", 250 * CENT),       # unknown shape: model+pool
    (None, "H100", "us-1", 200 * CENT),              # model only
    (None, "A100", "eu-1", 150 * CENT),              # pool only
    (None, "A100", "us-1", 100 * CENT),              # default
    (None, None, None, 100 * CENT),
])
def test_most_specific_gpu_hour_price_wins(plist, shape, model, pool, expected):
    assert price_for(plist, shape, model, pool, False, T0).micros_per_gpu_hour == expected


def test_precedence_does_not_depend_on_declaration_order():
    reversed_list = PriceList("tessera", (version(prices=tuple(reversed(PRICES))),))
    assert price_for(reversed_list, None, "H100", "eu-1", False, T0).micros_per_gpu_hour == 250 * CENT


def test_no_matching_price_and_no_default_is_refused():
    plist = PriceList("tessera", (version(prices=(GpuHourPrice(1, gpu_model="H100"),)),))
    with pytest.raises(NoPriceError) as e:
        price_for(plist, None, "A100", None, False, T0)
    assert e.value.field == "gpu_model"


def test_sku_ids_name_the_selectors_and_the_version(plist):
    up = price_for(plist, None, "H100", "eu-1", True, T0)
    assert up.sku_id == "gpu-hour:model=H100,pool=eu-1"
    assert up.sku_price_id == "gpu-hour:model=H100,pool=eu-1@v1:spot"


# -- versions and effective dates -------------------------------------------------------------------------

def test_version_in_force_is_the_latest_effective_at_or_before_the_instant():
    v1, v2 = version("v1", T0), version("v2", T0 + timedelta(days=30), prices=(GpuHourPrice(999),))
    plist = PriceList("tessera", (v2, v1))
    assert plist.version_at(T0).version == "v1"
    assert plist.version_at(T0 + timedelta(days=30) - timedelta(microseconds=1)).version == "v1"
    assert plist.version_at(T0 + timedelta(days=30)).version == "v2"      # effective_from is inclusive
    assert price_for(plist, None, "H100", None, False, T0 + timedelta(days=31)).micros_per_gpu_hour == 999


def test_no_version_in_force_before_the_first_one(plist):
    with pytest.raises(NoPriceError) as e:
        plist.version_at(T0 - timedelta(seconds=1))
    assert e.value.field == "at"


def test_publish_supersedes_with_a_new_version_and_keeps_the_old_one():
    plist = PriceList("tessera", (version("v1", T0),))
    newer = plist.publish(version("v2", T0 + timedelta(days=1)), now=T0 + timedelta(hours=1))
    assert [v.version for v in newer.versions] == ["v1", "v2"]
    assert [v.version for v in plist.versions] == ["v1"]                  # persistent: the old list is unchanged


def test_an_effective_version_cannot_be_replaced():
    plist = PriceList("tessera", (version("v1", T0),))
    with pytest.raises(ImmutableVersionError) as e:
        plist.publish(version("v1", T0 + timedelta(days=2)), now=T0 + timedelta(days=1))
    assert e.value.field == "version"


def test_a_scheduled_version_can_be_replaced_before_it_takes_effect():
    plist = PriceList("tessera", (version("v1", T0), version("v2", T0 + timedelta(days=10))))
    fixed = plist.publish(version("v2", T0 + timedelta(days=12), prices=(GpuHourPrice(7),)), now=T0 + timedelta(days=1))
    assert fixed.version_at(T0 + timedelta(days=12)).gpu_hour == (GpuHourPrice(7),)
    assert len(fixed.versions) == 2


def test_a_version_cannot_take_effect_in_the_past():
    plist = PriceList("tessera", (version("v1", T0),))
    with pytest.raises(PricingError) as e:
        plist.publish(version("v2", T0 + timedelta(hours=1)), now=T0 + timedelta(hours=2))
    assert e.value.field == "effective_from"


def test_versions_and_their_prices_are_frozen():
    v = version()
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.spot_discount_bps = 0
    with pytest.raises(TypeError):
        v.gb_hour["standard"] = 1
    assert isinstance(v.gpu_hour, tuple)


def test_two_versions_at_the_same_instant_or_with_the_same_id_are_refused():
    with pytest.raises(PricingError) as e:
        PriceList("tessera", (version("v1", T0), version("v2", T0)))
    assert e.value.field == "effective_from"
    with pytest.raises(PricingError) as e:
        PriceList("tessera", (version("v1", T0), version("v1", T0 + timedelta(days=1))))
    assert e.value.field == "version"


# -- spot -----------------------------------------------------------------------------------------------

def test_spot_discount_applies_in_basis_points(plist):
    on_demand = price_for(plist, None, "H100", None, False, T0)
    spot = price_for(plist, None, "H100", None, True, T0)
    assert rate_gpu(3600, 1, on_demand) == 200                           # 2.00 USD
    assert rate_gpu(3600, 1, spot) == 140                                # 30 % off
    assert rate_gpu(3600, 1, spot, spot=False) == 200                    # the list amount of a spot line


def test_hourly_price_is_exact_and_spot_discounted(plist):
    quote = hourly_price(plist, "gpu.8xh100", "H100", "eu-1", False, 8, T0)
    assert (quote.currency, quote.amount) == ("USD", Decimal("24"))
    spot = hourly_price(plist, None, "H100", None, True, 3, T0 + timedelta(days=1))
    assert spot.amount == Decimal("4.2")
    assert spot.as_wire() == {"currency": "USD", "amount": "4.2", "price_list_version": "v1",
                              "sku_price_id": "gpu-hour:model=H100@v1:spot"}
    odd = PriceList("tessera", (version(prices=(GpuHourPrice(1),), spot_discount_bps=1),))
    assert hourly_price(odd, None, None, None, True, 1, T0).amount == Decimal("0.0000009999")


def test_a_full_spot_discount_rates_zero():
    assert rate_gpu(3600, 8, unit(300 * CENT, spot=True, bps=10_000)) == 0


# -- rounding: exact integers, half to even once per line -------------------------------------------------

def test_one_gpu_second_rates_exactly():
    assert rate_gpu(1, 1, unit(3_600 * CENT)) == 1                       # 36.00/h -> exactly 1 cent per second
    assert rate_gpu(1, 1, unit(360 * CENT)) == 0                         # 0.1 cent rounds to 0
    assert rate_gpu(1, 1, unit(360 * CENT * 6)) == 1                     # 0.6 cent rounds to 1


@pytest.mark.parametrize("seconds, expected", [(1800, 0), (5400, 2), (9000, 2), (12600, 4)])
def test_half_minor_unit_ties_round_to_even(seconds, expected):
    # 1 cent per hour: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4
    assert rate_gpu(seconds, 1, unit(CENT)) == expected


def test_rounding_happens_once_per_line_not_per_gpu_or_second():
    # 3 GPUs x 1800 s at 1 cent/h = 1.5 cents -> 2 (per GPU it would be 3 x round(0.5) = 0)
    assert rate_gpu(1800, 3, unit(CENT)) == 2


def test_large_values_stay_exact():
    year = 366 * 24 * 3600
    amount = rate_gpu(year * 10, 100_000, unit(123_456_789))            # 10 years of 100k GPUs at 123.456789/h
    assert amount == 123_456_789 * 100_000 * 10 * 366 * 24 // 10_000
    assert rate_storage(10**18 * year, StoragePrice("v1", "USD", "fast", 500)) == 10**9 * 366 * 24 * 500 // CENT


def test_fractional_seconds_are_exact():
    assert rate_gpu(Decimal("0.5"), 1, unit(7_200 * CENT)) == 1          # 72.00/h for half a second = 1 cent
    assert rate_gpu(Fraction(1, 2), 1, unit(7_200 * CENT)) == 1
    assert rate_gpu(0.5, 1, unit(7_200 * CENT)) == 1                     # a float is read as its repr


def test_currency_exponent_sets_the_minor_unit():
    assert rate_gpu(3600, 1, unit(1_500_000, currency="JPY")) == 2       # 1.5 yen -> 2 (ties to even)
    assert rate_gpu(3600, 1, unit(1_234_567, currency="KWD")) == 1235    # fils, half-even of 1234.567
    assert [currency_exponent(c) for c in ("USD", "EUR", "JPY", "BHD")] == [2, 2, 0, 3]


def test_storage_rates_gb_hours_with_decimal_gigabytes(plist):
    standard = storage_price_for(plist, "standard", T0)                 # 0.014 cent per GB-hour
    assert rate_storage(500 * 10**9 * 86_400, standard) == 168           # 500 GB for a day = 12,000 GB-h = 1.68
    assert rate_storage(2**30 * 3600, StoragePrice("v1", "USD", "x", CENT)) == 1   # a GiB-hour is 1.07 GB-h


def test_round_half_even_handles_negative_amounts():
    assert [round_half_even(n, 2) for n in (-5, -3, -1, 1, 3, 5)] == [-2, -2, 0, 0, 2, 2]


# -- validation ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, field", [
    (lambda: version(currency="usd"), "currency"),
    (lambda: version(currency="US"), "currency"),
    (lambda: version(at=datetime(2026, 11, 1)), "effective_from"),
    (lambda: version(spot_discount_bps=10_001), "spot_discount_bps"),
    (lambda: version(spot_discount_bps=-1), "spot_discount_bps"),
    (lambda: version(vid=""), "version"),
    (lambda: version(gb_hour={"standard": 1.5}), "micros_per_gb_hour"),
    (lambda: version(prices=(GpuHourPrice(1), GpuHourPrice(2))), "gpu_hour"),
    (lambda: GpuHourPrice(-1), "micros_per_gpu_hour"),
    (lambda: GpuHourPrice(1.0), "micros_per_gpu_hour"),
    (lambda: GpuHourPrice(1, shape="s", gpu_model="H100"), "shape"),
    (lambda: GpuHourPrice(1, pool=""), "pool"),
    (lambda: rate_gpu(-1, 1, unit(1)), "usage_seconds"),
    (lambda: rate_gpu(float("nan"), 1, unit(1)), "usage_seconds"),
    (lambda: rate_gpu(True, 1, unit(1)), "usage_seconds"),
    (lambda: rate_gpu(1, -1, unit(1)), "gpus"),
    (lambda: rate_storage("lots", StoragePrice("v1", "USD", "x", 1)), "byte_seconds"),
    (lambda: hourly_price(PriceList("p", (version(),)), None, None, None, False, 0, T0), "gpus"),
    (lambda: price_for(PriceList("p", (version(),)), None, None, None, "yes", T0), "spot"),
    (lambda: price_for(PriceList("p", (version(),)), None, None, None, False, datetime(2026, 11, 2)), "at"),
    (lambda: storage_price_for(PriceList("p", (version(),)), "archive", T0), "storage_class"),
])
def test_invalid_input_raises_a_value_error_naming_the_field(make, field):
    with pytest.raises(ValueError) as e:
        make()
    assert isinstance(e.value, PricingError)
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}:")
