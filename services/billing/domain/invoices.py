"""Invoices: which invoice a ledger entry is billed on, its line, and the finalized document's hash. Pure.

Periods
    An invoice covers one tenant's UTC calendar month [first day 00:00, first day of the next month). It is a
    draft while its period runs and until ``grace_until = period_end + grace``; then it is finalized (by the
    invoices tick) and never changes again.
Where an entry goes
    On the invoice of its usage record's month (``period_start``) while that invoice is *open*: it exists as a
    draft (even past its grace, until the tick finalizes it), or it does not exist yet and ``now <
    grace_until``. Otherwise the entry is late: it goes on the first open invoice after that month (normally
    the month of ``now``) as a *correction* line naming the month it corrects (``corrects_period`` 'YYYY-MM').
    A month whose grace ended without any invoice is closed too: late usage never opens an invoice of the past.
Lines
    One line per (correction and corrected month, kind, SKU price or 'unrated', currency, price-list version):
    the line sums its entries' amounts (integer minor units, each rounded once when rated) and their exact
    quantities, shown in GPU-hours (GPU-seconds / 3600) or GB-hours (byte-seconds / 3.6e12), rounded half to
    even to QUANTITY_PLACES decimals (a GPU-second is not a finite decimal of an hour).
Totals
    Per currency, over the lines, leaving out 'XXX' (no currency: unrated usage, always 0). ``ledger_sum`` is the
    same sum over the invoice's ledger entries; the two are equal (the invariant the finalizer checks).
Number and hash
    ``TSR-<YYYYMM>-<first 8 hex digits of the tenant id>`` (readable, not unique across tenants: the invoice id
    is). The finalized document's ``content_hash`` is sha256 over the canonical JSON (shared.chain) of
    ``{"lines": [...], "totals": [...]}``, lines in line_key order.
"""
from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from shared.chain import canonical_json

from .usage import NO_CURRENCY

DRAFT, FINALIZED = "draft", "finalized"
QUANTITY_PLACES = 9
UNITS = {"gpu": ("GPU-hours", Fraction(3600)), "storage": ("GB-hours", Fraction(36 * 10**11))}
KIND_NAMES = {"gpu": "GPU usage", "storage": "Storage usage"}


@dataclass(frozen=True, order=True)
class Period:
    """One UTC calendar month, by its first instant."""
    start: datetime

    @property
    def end(self) -> datetime:
        return self.next().start

    @property
    def label(self) -> str:
        return f"{self.start.year:04d}-{self.start.month:02d}"

    def next(self) -> Period:
        y, m = (self.start.year + 1, 1) if self.start.month == 12 else (self.start.year, self.start.month + 1)
        return Period(datetime(y, m, 1, tzinfo=UTC))

    def grace_until(self, grace: timedelta) -> datetime:
        return self.end + grace


def period_of(t: datetime) -> Period:
    """The month ``t`` (timezone-aware) falls in, in UTC; ValueError for a naive datetime."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"naive datetime {t!r}: invoice periods are UTC months of aware instants")
    u = t.astimezone(UTC)
    return Period(datetime(u.year, u.month, 1, tzinfo=UTC))


def is_open(period: Period, status: str | None, now: datetime, grace: timedelta) -> bool:
    """Whether an entry may still be added to ``period``'s invoice (``status`` None: it does not exist)."""
    if status is None:
        return now < period.grace_until(grace)
    return status == DRAFT


@dataclass(frozen=True)
class Target:
    period: Period
    corrects: Period | None = None     # the month late usage belongs to, when it goes on a later invoice

    @property
    def correction(self) -> bool:
        return self.corrects is not None


def target(usage_start: datetime, now: datetime, grace: timedelta, statuses: Mapping[datetime, str]) -> Target:
    """The invoice an entry of usage starting at ``usage_start`` goes on. ``statuses``: the tenant's invoices
    (period start -> status), at least every one from the usage's month on. Always ends: past the last invoice
    there, a month that has not ended is open."""
    own = period_of(usage_start)
    if is_open(own, statuses.get(own.start), now, grace):
        return Target(own)
    p = own.next()
    while not is_open(p, statuses.get(p.start), now, grace):
        p = p.next()
    return Target(p, corrects=own)


@dataclass(frozen=True)
class LineSpec:
    """What an entry adds to: the line's identity and description (its sums live with the invoice)."""
    line_key: str
    description: str
    kind: str
    correction: bool
    corrects_period: str | None
    sku_price_id: str | None
    price_list_version: str | None
    unit: str
    currency: str


def line_for(*, kind: str, sku_price_id: str | None, currency: str, price_list_version: str | None,
             corrects: Period | None = None) -> LineSpec:
    if kind not in UNITS:
        raise ValueError(f"unknown usage kind {kind!r}")
    sku = sku_price_id or "unrated"
    prefix = f"correction:{corrects.label}|" if corrects else ""
    key = f"{prefix}{kind}|{sku}|{currency}|{price_list_version or '-'}"
    what = f"{KIND_NAMES[kind]}, {sku_price_id}" if sku_price_id else f"{KIND_NAMES[kind]}, unrated (no price in force)"
    if price_list_version:
        what += f", price list {price_list_version}"
    if corrects:
        what = f"Correction for {corrects.label}: {what}"
    return LineSpec(key, what, kind, corrects is not None, corrects.label if corrects else None, sku_price_id,
                    price_list_version, UNITS[kind][0], currency)


def quantity_in_unit(kind: str, base_quantity: Decimal | Fraction | int) -> str:
    """GPU-seconds or byte-seconds (exact) as GPU-hours or GB-hours, half to even at QUANTITY_PLACES, with no
    trailing zeros ('1.5', '0.000277778', '2')."""
    q = Fraction(base_quantity) / UNITS[kind][1]
    scaled = round(q * 10**QUANTITY_PLACES)             # Fraction.__round__: half to even, exact
    text = format(Decimal(scaled).scaleb(-QUANTITY_PLACES), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def totals(amounts: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """(currency, amount_minor) pairs summed per currency, sorted, without 'XXX' (unrated usage)."""
    out: dict[str, int] = {}
    for currency, amount in amounts:
        if currency != NO_CURRENCY:
            out[currency] = out.get(currency, 0) + amount
    return sorted(out.items())


def invoice_number(tenant_id: uuid.UUID, period: Period) -> str:
    return f"TSR-{period.start.year:04d}{period.start.month:02d}-{tenant_id.hex[:8]}"


def content_hash(lines: list[dict], totals_: list[dict]) -> str:
    """sha256 (hex) of the canonical JSON of the lines (in line_key order) and totals (JSON-ready dicts)."""
    body = {"lines": sorted(lines, key=lambda line: line["line_key"]), "totals": totals_}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()
