"""Price lists and rating: pure, exact integer arithmetic, no I/O.

A provider publishes a :class:`PriceList` as a sequence of immutable :class:`PriceListVersion` s.

Versions
    Each version has an id, an ISO 4217 currency (3 upper-case letters), a tz-aware ``effective_from``,
    GPU-hour prices, GB-hour prices by storage class and a spot discount in basis points.
    The version in force at an instant is the one with the latest ``effective_from`` <= instant.
    A version is immutable once effective: :meth:`PriceList.publish` refuses to replace a version that is
    already in force (or was), and refuses a new version that would take effect in the past (that would
    re-price usage already rated). A scheduled (future) version may be replaced under the same id.

GPU-hour precedence (most specific wins)
    ``shape`` > ``gpu_model`` + ``pool`` > ``gpu_model`` > ``pool`` > default (no selector).
    A price names at most one of these selector sets (shape alone; model and pool; model; pool; none);
    two prices with the same selectors in one version are refused.

Units and rounding
    Prices are integer *micros* per unit-hour: millionths of the currency's major unit (1 USD = 1_000_000
    micros, so 1 cent = 10_000 micros; 1 JPY = 1_000_000 micros). Storage is priced per GB-hour with
    GB = 10**9 bytes. Amounts are integers in the currency's minor unit (ISO 4217 exponent).
    Rating multiplies everything exactly (integers and the spot factor ``(10000 - bps) / 10000``) and
    rounds **once per rated line, half to even**, to minor units. So 1 GPU-second at 3.60 USD/h is exactly
    0.1 cent, which rounds to 0; 0.5 cent rounds to 0 and 1.5 cents to 2.

Errors
    Every validation error is a :class:`PricingError` (a ``ValueError``) whose ``field`` names the field.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType

MICROS = 10**6                 # micros per major currency unit
BYTES_PER_GB = 10**9           # GB as FOCUS and storage vendors count it (not GiB)
SECONDS_PER_HOUR = 3600
BPS = 10_000                   # basis points in 100 %

# ISO 4217 minor-unit exponents that are not 2 (the common case).
_EXPONENTS = {
    "BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0, "RWF": 0,
    "UGX": 0, "UYI": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
    "BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
    "CLF": 4, "UYW": 4,
}
_CURRENCY = re.compile(r"[A-Z]{3}")


class PricingError(ValueError):
    """A price list, price or rating input is invalid; ``field`` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class ImmutableVersionError(PricingError):
    """A version already in force (or in the past) cannot be replaced, only superseded."""


class NoPriceError(PricingError):
    """No version is in force at the instant, or no price matches the request."""


def currency_exponent(currency: str) -> int:
    """ISO 4217 minor-unit exponent (2 unless listed); raises PricingError on a malformed code."""
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        raise PricingError("currency", f"must be an ISO 4217 code of 3 upper-case letters, got {currency!r}")
    return _EXPONENTS.get(currency, 2)


def round_half_even(numerator: int, denominator: int) -> int:
    """The integer nearest numerator/denominator, ties to even (banker's rounding); denominator > 0."""
    q, r = divmod(numerator, denominator)
    if 2 * r > denominator or (2 * r == denominator and q % 2 == 1):
        q += 1
    return q


def _check_int(name: str, value: object, *, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PricingError(name, f"must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise PricingError(name, f"must be in [{minimum}, {maximum if maximum is not None else '∞'}], got {value}")
    return value


def _quantity(name: str, value: object) -> Fraction:
    """An exact non-negative quantity: int, Decimal, Fraction, or a float read as its shortest repr."""
    if isinstance(value, bool):
        raise PricingError(name, "must be a number, got a bool")
    try:
        q = Fraction(Decimal(repr(value))) if isinstance(value, float) else Fraction(value)
    except (TypeError, ValueError, ArithmeticError):
        raise PricingError(name, f"must be a finite number, got {value!r}") from None
    if q < 0:
        raise PricingError(name, f"must not be negative, got {value!r}")
    return q


def _selector(name: str, value: str | None) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise PricingError(name, f"must be a non-empty string or None, got {value!r}")
    return value


@dataclass(frozen=True)
class GpuHourPrice:
    """Micros per GPU-hour for the usage its selectors match; no selector at all is the default price."""
    micros_per_gpu_hour: int
    shape: str | None = None
    gpu_model: str | None = None
    pool: str | None = None

    def __post_init__(self):
        _check_int("micros_per_gpu_hour", self.micros_per_gpu_hour)
        for name in ("shape", "gpu_model", "pool"):
            _selector(name, getattr(self, name))
        if self.shape is not None and (self.gpu_model is not None or self.pool is not None):
            raise PricingError("shape", "a shape price names no gpu_model or pool (the shape implies them)")

    @property
    def rank(self) -> int:
        """Precedence: shape 4 > model+pool 3 > model 2 > pool 1 > default 0."""
        if self.shape is not None:
            return 4
        if self.gpu_model is not None:
            return 3 if self.pool is not None else 2
        return 1 if self.pool is not None else 0

    @property
    def sku_id(self) -> str:
        parts = [f"{k}={v}" for k, v in (("shape", self.shape), ("model", self.gpu_model), ("pool", self.pool)) if v]
        return "gpu-hour" + (":" + ",".join(parts) if parts else ":default")

    def matches(self, shape: str | None, gpu_model: str | None, pool: str | None) -> bool:
        if self.shape is not None:
            return self.shape == shape
        return ((self.gpu_model is None or self.gpu_model == gpu_model)
                and (self.pool is None or self.pool == pool))


@dataclass(frozen=True)
class PriceListVersion:
    """One immutable published version; ``gb_hour`` maps storage class -> micros per GB-hour."""
    version: str
    currency: str
    effective_from: datetime
    gpu_hour: tuple[GpuHourPrice, ...] = ()
    gb_hour: Mapping[str, int] = field(default_factory=dict)
    spot_discount_bps: int = 0

    def __post_init__(self):
        if not isinstance(self.version, str) or not self.version:
            raise PricingError("version", "must be a non-empty string")
        currency_exponent(self.currency)
        if not isinstance(self.effective_from, datetime) or self.effective_from.utcoffset() is None:
            raise PricingError("effective_from", "must be a timezone-aware datetime")
        _check_int("spot_discount_bps", self.spot_discount_bps, maximum=BPS)
        prices = tuple(self.gpu_hour)
        seen = set()
        for p in prices:
            if not isinstance(p, GpuHourPrice):
                raise PricingError("gpu_hour", f"must hold GpuHourPrice, got {p!r}")
            key = (p.shape, p.gpu_model, p.pool)
            if key in seen:
                raise PricingError("gpu_hour", f"two prices for the same selectors {key}")
            seen.add(key)
        classes = dict(self.gb_hour)
        for cls, micros in classes.items():
            _selector("storage_class", cls)
            _check_int("micros_per_gb_hour", micros)
        object.__setattr__(self, "gpu_hour", prices)
        object.__setattr__(self, "gb_hour", MappingProxyType(classes))

    @property
    def exponent(self) -> int:
        return currency_exponent(self.currency)


@dataclass(frozen=True)
class PriceList:
    """A provider's published versions, ordered by ``effective_from``. Persistent: publish returns a new list."""
    provider: str
    versions: tuple[PriceListVersion, ...] = ()

    def __post_init__(self):
        ordered = tuple(sorted(self.versions, key=lambda v: v.effective_from))
        if len({v.version for v in ordered}) != len(ordered):
            raise PricingError("version", "version ids must be unique")
        if len({v.effective_from for v in ordered}) != len(ordered):
            raise PricingError("effective_from", "two versions cannot take effect at the same instant")
        object.__setattr__(self, "versions", ordered)

    def publish(self, version: PriceListVersion, now: datetime) -> PriceList:
        """A new list with ``version`` added (or a scheduled version of the same id replaced).

        Raises ImmutableVersionError when a version of that id is already effective at ``now``, and
        PricingError(field='effective_from') when the new version would take effect before ``now``."""
        if not isinstance(now, datetime) or now.utcoffset() is None:
            raise PricingError("now", "must be a timezone-aware datetime")
        kept = []
        for v in self.versions:
            if v.version == version.version:
                if v.effective_from <= now:
                    raise ImmutableVersionError("version", f"{v.version} is effective since {v.effective_from}; "
                                                           "publish a new version to supersede it")
                continue
            kept.append(v)
        if version.effective_from < now:
            raise PricingError("effective_from", "a version cannot take effect in the past (usage already rated)")
        return replace(self, versions=(*kept, version))

    def version_at(self, at: datetime) -> PriceListVersion:
        """The version in force at ``at``: the latest with effective_from <= at. Raises NoPriceError."""
        if not isinstance(at, datetime) or at.utcoffset() is None:
            raise PricingError("at", "must be a timezone-aware datetime")
        in_force = [v for v in self.versions if v.effective_from <= at]
        if not in_force:
            raise NoPriceError("at", f"no {self.provider} price list version is in force at {at.isoformat()}")
        return in_force[-1]


@dataclass(frozen=True)
class UnitPrice:
    """The GPU-hour price that applies to a usage: the matched price, its version, and the spot terms."""
    version: str
    currency: str
    micros_per_gpu_hour: int          # list (on-demand) price
    spot_discount_bps: int            # the version's spot discount
    spot: bool                        # whether this usage is spot (the discount applies)
    sku_id: str

    @property
    def exponent(self) -> int:
        return currency_exponent(self.currency)

    @property
    def sku_price_id(self) -> str:
        return f"{self.sku_id}@{self.version}" + (":spot" if self.spot else "")

    def factor(self, spot: bool | None = None) -> Fraction:
        """The price multiplier: 1, or (10000 - bps) / 10000 for spot usage."""
        is_spot = self.spot if spot is None else spot
        return Fraction(BPS - self.spot_discount_bps, BPS) if is_spot else Fraction(1)


@dataclass(frozen=True)
class StoragePrice:
    """The GB-hour price of one storage class in one version."""
    version: str
    currency: str
    storage_class: str
    micros_per_gb_hour: int

    @property
    def exponent(self) -> int:
        return currency_exponent(self.currency)

    @property
    def sku_id(self) -> str:
        return f"gb-hour:class={self.storage_class}"

    @property
    def sku_price_id(self) -> str:
        return f"{self.sku_id}@{self.version}"


@dataclass(frozen=True)
class HourlyPrice:
    """What a tenant is shown before it runs: the exact price per hour for all its GPUs."""
    currency: str
    amount: Decimal                   # major units, exact (e.g. Decimal('17.5'))
    version: str
    sku_price_id: str

    def as_wire(self) -> dict:
        return {"currency": self.currency, "amount": str(self.amount), "price_list_version": self.version,
                "sku_price_id": self.sku_price_id}


def price_for(price_list: PriceList, shape: str | None, gpu_model: str | None, pool: str | None,
              spot: bool, at: datetime) -> UnitPrice:
    """The GPU-hour price in force at ``at`` for this usage, by precedence
    shape > model+pool > model > pool > default. Raises NoPriceError when nothing matches."""
    for name, value in (("shape", shape), ("gpu_model", gpu_model), ("pool", pool)):
        _selector(name, value)
    if not isinstance(spot, bool):
        raise PricingError("spot", f"must be a bool, got {spot!r}")
    version = price_list.version_at(at)
    matches = [p for p in version.gpu_hour if p.matches(shape, gpu_model, pool)]
    if not matches:
        raise NoPriceError("gpu_model", f"no GPU-hour price in {version.version} for shape={shape!r} "
                                        f"gpu_model={gpu_model!r} pool={pool!r}")
    best = max(matches, key=lambda p: p.rank)
    return UnitPrice(version.version, version.currency, best.micros_per_gpu_hour, version.spot_discount_bps,
                     spot, best.sku_id)


def storage_price_for(price_list: PriceList, storage_class: str, at: datetime) -> StoragePrice:
    """The GB-hour price of ``storage_class`` in force at ``at``; raises NoPriceError when unpriced."""
    _selector("storage_class", storage_class)
    version = price_list.version_at(at)
    if storage_class not in version.gb_hour:
        raise NoPriceError("storage_class", f"{storage_class!r} has no GB-hour price in {version.version}")
    return StoragePrice(version.version, version.currency, storage_class, version.gb_hour[storage_class])


def hourly_price(price_list: PriceList, shape: str | None, gpu_model: str | None, pool: str | None,
                 spot: bool, gpus: int, at: datetime) -> HourlyPrice:
    """The exact price of one hour of ``gpus`` GPUs (spot-discounted when spot), in major units."""
    _check_int("gpus", gpus, minimum=1)
    unit = price_for(price_list, shape, gpu_model, pool, spot, at)
    micros = unit.micros_per_gpu_hour * gpus * unit.factor()
    # micros * (BPS - bps) / BPS has denominator dividing 10**4, so scaling by 10**4 is exact.
    amount = Decimal(int(micros * BPS)).scaleb(-10).normalize()
    if amount == amount.to_integral_value():
        amount = amount.quantize(Decimal(1))
    return HourlyPrice(unit.currency, amount, unit.version, unit.sku_price_id)


def to_minor(micros: Fraction, exponent: int) -> int:
    """Exact micros (major/10**6) to minor units, rounded half to even once."""
    scaled = micros * 10**exponent
    return round_half_even(scaled.numerator, scaled.denominator * MICROS)


def rate_gpu(usage_seconds, gpus: int, unit_price: UnitPrice, spot: bool | None = None) -> int:
    """Minor units owed for ``gpus`` GPUs used ``usage_seconds``: exact, rounded half-even once.

    ``spot`` defaults to ``unit_price.spot``; pass False to get the list (on-demand) amount of a spot line."""
    seconds = _quantity("usage_seconds", usage_seconds)
    _check_int("gpus", gpus)
    if spot is not None and not isinstance(spot, bool):
        raise PricingError("spot", f"must be a bool or None, got {spot!r}")
    micros = seconds * gpus * unit_price.micros_per_gpu_hour * unit_price.factor(spot) / SECONDS_PER_HOUR
    return to_minor(micros, unit_price.exponent)


def rate_storage(byte_seconds, class_price: StoragePrice) -> int:
    """Minor units owed for ``byte_seconds`` (bytes held x seconds) at a GB-hour price (GB = 10**9 B)."""
    quantity = _quantity("byte_seconds", byte_seconds)
    micros = quantity * class_price.micros_per_gb_hour / (BYTES_PER_GB * SECONDS_PER_HOUR)
    return to_minor(micros, class_price.exponent)
