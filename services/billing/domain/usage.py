"""Usage records and their rating: pure, exact, no I/O.

Metering rules
    GPU: a meter is cut while it runs (every ``TESSERA_BILLING_CUT_S``) and at its stop. A cut records
    [since, until), since = the meter's ``cut_until`` (or its start), split at UTC hour boundaries; each piece
    is one usage record keyed ``meter:<meter id>@<piece start, ISO 8601>`` whose quantity is GPUs × seconds
    (exact, microseconds). Pieces never overlap (the next cut starts where the last ended), so a repeated cut
    or a redelivered stop has nothing left to record.
    Storage: a usage report for a volume closes the interval since that volume's previous report; the record
    ``storage:<volume id>@<report time>`` is the bytes used at the previous report × the seconds between them
    (what was held, as last measured). The first report of a volume opens its interval and bills nothing.
Rating rules
    A meter's GPU usage is rated with the price it was quoted at creation (``QuotedPrice``, carried on each
    record) when it has one; else with the price-list version in force at the start of the meter's first piece
    of that UTC hour (``rated_from``), so a version taking effect mid-hour applies from the next hour, however
    often the hour was cut.
    Amounts are integer minor units (pricing.rate_gpu / rate_storage: exact, rounded half to even). Pieces of
    one meter-hour are rated cumulatively: a piece's amount is the rounded amount of the hour up to its end
    minus that up to its start, so the pieces of an hour sum to the hour rated and rounded once, whatever the
    cut interval (a minute at 2.50/h is 4.1666 cents: rounding each would lose 4 %).
    A record with no version in force, or no price that matches, is recorded *unrated*: amount 0,
    currency XXX (ISO 4217 "no currency"), and the reason. It is never rated later: a version cannot take
    effect in the past (pricing.PriceList.publish), so no later list could ever apply to it; the ledger still
    gets its (zero) entry so that every usage record has exactly one ledger entry.
    ``list_amount_minor`` is the amount at list (on-demand) price (equal to the amount unless spot);
    ``micros_per_unit_hour`` the list price per GPU-hour or GB-hour applied (None when unrated).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from .model import Meter, QuotedPrice
from .pricing import (
    GpuHourPrice,
    NoPriceError,
    PriceList,
    PriceListVersion,
    UnitPrice,
    price_for,
    rate_gpu,
    rate_storage,
    storage_price_for,
)

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
    price: QuotedPrice | None = None     # the meter's quoted price (None: the price list in force)
    rated_from: datetime | None = None   # start of the meter's first piece of this UTC hour (None: period_start)

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


def hour_of(t: datetime) -> datetime:
    """The UTC hour ``t`` falls in."""
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def meter_records(meter: Meter, until: datetime) -> list[UsageRecord]:
    """The meter's usage not yet recorded, [meter.recorded_until, until), one record per UTC hour piece (keys
    stable: cutting the same interval again yields the same keys; nothing when until <= recorded_until)."""
    return [UsageRecord("meter", f"{meter.id}@{a.isoformat()}", "gpu", meter.tenant_id, a, b,
                        _seconds(a, b) * meter.gpu_count, user_id=meter.user_id, allocation_id=meter.allocation_id,
                        shape=meter.shape, gpu_model=meter.gpu_model, pool=meter.pool, spot=meter.spot,
                        gpu_count=meter.gpu_count, price=meter.price,
                        rated_from=max(hour_of(a), meter.started_at))
            for a, b in hours_between(meter.recorded_until, until)]


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


def quoted_unit(q: QuotedPrice) -> UnitPrice:
    return UnitPrice(q.price_list_version, q.currency, q.micros_per_gpu_hour, q.spot_discount_bps, q.spot, q.sku_id)


def _rate_gpu(record: UsageRecord, prices: PriceList) -> Rating:
    start = record.rated_from or record.period_start
    unit = (quoted_unit(record.price) if record.price is not None else
            price_for(prices, record.shape, record.gpu_model, record.pool, record.spot, start))
    before = _seconds(start, record.period_start) * (record.gpu_count or 1)   # GPU-seconds of this hour before

    def cumulative(spot: bool | None) -> int:   # rate_gpu of nothing is 0: one call for a record from the hour's start
        through = rate_gpu(before + record.quantity, 1, unit, spot)
        return through - rate_gpu(before, 1, unit, spot) if before else through
    detail = {"micros_per_gpu_hour": unit.micros_per_gpu_hour,
              "spot_discount_bps": unit.spot_discount_bps if unit.spot else 0}
    if record.price is not None:
        detail["quoted_price"] = True
    if start != record.period_start:
        detail["rated_from"] = start.isoformat()
    amount = cumulative(None)
    return Rating(amount, unit.currency, True, unit.version, unit.sku_price_id, detail=detail,   # list = amount off spot
                  list_amount_minor=cumulative(False) if unit.spot else amount,
                  micros_per_unit_hour=unit.micros_per_gpu_hour)


def rate(record: UsageRecord, prices: PriceList) -> Rating:
    """The record's amount (see the rating rules above); unrated (with the reason) when no price applies."""
    try:
        if record.kind == "gpu":
            return _rate_gpu(record, prices)
        if record.storage_class is None:
            return unrated("the volume's storage class is not known yet")
        price = storage_price_for(prices, record.storage_class, record.period_start)
        amount = rate_storage(record.quantity, price)
        return Rating(amount, price.currency, True, price.version, price.sku_price_id,
                      detail={"micros_per_gb_hour": price.micros_per_gb_hour}, list_amount_minor=amount,
                      micros_per_unit_hour=price.micros_per_gb_hour)
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
