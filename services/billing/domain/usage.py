"""Usage records and their rating: pure, exact, no I/O.

Metering rules
    GPU: a meter's interval [started_at, stopped_at) is split at UTC hour boundaries; each piece is one usage
    record keyed ``meter:<meter id>@<hour start>`` whose quantity is GPUs × seconds (exact, microseconds).
    Each piece is rated with the price-list version in force at the piece's start, so a version taking effect
    mid-hour applies from the next hour (a version takes effect on an hour boundary in practice).
    Storage: a usage report for a volume closes the interval since that volume's previous report; the record
    ``storage:<volume id>@<report time>`` is the bytes used at the previous report × the seconds between them
    (what was held, as last measured). The first report of a volume opens its interval and bills nothing.
Rating rules
    Amounts are integer minor units (pricing.rate_gpu / rate_storage: exact, rounded once per record, half to
    even). A record with no version in force, or no price that matches, is recorded *unrated*: amount 0,
    currency XXX (ISO 4217 "no currency"), and the reason. It is never rated later: a version cannot take
    effect in the past (pricing.PriceList.publish), so no later list could ever apply to it; the ledger still
    gets its (zero) entry so that every usage record has exactly one ledger entry.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from .pricing import (GpuHourPrice, NoPriceError, PriceList, PriceListVersion, price_for, rate_gpu, rate_storage,
                      storage_price_for)

NO_CURRENCY = "XXX"
HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class UsageRecord:
    """One metered quantity over [period_start, period_end). ``quantity``: GPU-seconds or byte-seconds."""
    source: str
    event_id: str
    kind: str
    tenant_id: uuid.UUID
    period_start: datetime
    period_end: datetime
    quantity: Fraction
    user_id: uuid.UUID | None = None
    allocation_id: uuid.UUID | None = None
    volume_id: uuid.UUID | None = None
    shape: str | None = None
    gpu_model: str | None = None
    pool: str | None = None
    spot: bool = False
    gpu_count: int | None = None
    storage_class: str | None = None

    @property
    def key(self) -> str:
        return f"{self.source}:{self.event_id}"

    @property
    def quantity_text(self) -> str:
        """The exact quantity as a decimal string (micro-second resolution: always a finite decimal)."""
        return format(Decimal(self.quantity.numerator) / Decimal(self.quantity.denominator), "f")


@dataclass(frozen=True)
class Rating:
    amount_minor: int
    currency: str
    rated: bool
    price_version: str | None = None
    sku_price_id: str | None = None
    reason: str | None = None
    detail: dict = field(default_factory=dict)
    list_amount_minor: int = 0                 # at list (on-demand) price: differs from amount_minor when spot
    micros_per_unit_hour: int | None = None    # the list price per GPU-hour or GB-hour applied


def _seconds(a: datetime, b: datetime) -> Fraction:
    d = b - a
    return Fraction(d.days * 86400 + d.seconds) + Fraction(d.microseconds, 10**6)


def hours_between(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at UTC hour boundaries (nothing when end <= start)."""
    pieces, cursor = [], start
    while cursor < end:
        boundary = cursor.replace(minute=0, second=0, microsecond=0) + HOUR
        pieces.append((cursor, min(boundary, end)))
        cursor = pieces[-1][1]
    return pieces


def meter_records(*, meter_id: uuid.UUID, allocation_id: uuid.UUID, tenant_id: uuid.UUID, user_id: uuid.UUID | None,
                  shape: str, gpu_model: str | None, pool: str | None, spot: bool, gpu_count: int,
                  started_at: datetime, stopped_at: datetime) -> list[UsageRecord]:
    """A stopped meter's usage, one record per UTC hour it ran in (keys stable: re-metering yields the same)."""
    return [UsageRecord("meter", f"{meter_id}@{a.replace(minute=0, second=0, microsecond=0).isoformat()}", "gpu",
                        tenant_id, a, b, _seconds(a, b) * gpu_count, user_id=user_id, allocation_id=allocation_id,
                        shape=shape, gpu_model=gpu_model, pool=pool, spot=spot, gpu_count=gpu_count)
            for a, b in hours_between(started_at, stopped_at)]


def storage_record(*, volume_id: uuid.UUID, tenant_id: uuid.UUID, user_id: uuid.UUID | None,
                   storage_class: str | None, used_bytes: int, since: datetime, until: datetime) -> UsageRecord | None:
    """The bytes used at the previous report (``used_bytes``, at ``since``) held until this report (``until``);
    None when the interval is empty (a repeated or out-of-order report)."""
    if until <= since:
        return None
    return UsageRecord("storage", f"{volume_id}@{until.isoformat()}", "storage", tenant_id, since, until,
                       _seconds(since, until) * used_bytes, user_id=user_id, volume_id=volume_id,
                       storage_class=storage_class)


def unrated(reason: str) -> Rating:
    return Rating(0, NO_CURRENCY, False, reason=reason)


def rate(record: UsageRecord, prices: PriceList) -> Rating:
    """The record's amount with the version in force at its start; unrated (with the reason) when none applies."""
    try:
        if record.kind == "gpu":
            unit = price_for(prices, record.shape, record.gpu_model, record.pool, record.spot, record.period_start)
            gpu_seconds = record.quantity
            amount = rate_gpu(gpu_seconds, 1, unit)
            return Rating(amount, unit.currency, True, unit.version, unit.sku_price_id,
                          detail={"micros_per_gpu_hour": unit.micros_per_gpu_hour,
                                  "spot_discount_bps": unit.spot_discount_bps if record.spot else 0})
        if record.storage_class is None:
            return unrated("the volume's storage class is not known yet")
        price = storage_price_for(prices, record.storage_class, record.period_start)
        return Rating(rate_storage(record.quantity, price), price.currency, True, price.version, price.sku_price_id,
                      detail={"micros_per_gb_hour": price.micros_per_gb_hour})
    except NoPriceError as exc:
        return unrated(str(exc))


def version_from_doc(doc: dict) -> PriceListVersion:
    """A price-list version from its wire document (contracts.PriceListDoc as a dict); raises PricingError.
    The gateway validates a request with this same function before it sends it."""
    return PriceListVersion(
        version=doc["version"], currency=doc["currency"], effective_from=doc["effective_from"],
        gpu_hour=tuple(GpuHourPrice(p["micros_per_gpu_hour"], p.get("shape"), p.get("gpu_model"), p.get("pool"))
                       for p in doc.get("gpu_hour", ())),
        gb_hour=dict(doc.get("gb_hour", {})), spot_discount_bps=doc.get("spot_discount_bps", 0))
