"""FOCUS 1.2 cost-and-usage rows from rated lines, and a CSV writer. Pure except ``write_csv``.

Spec references are to FOCUS_Spec at tag v1.2: ``specification/columns/<name>.md`` ("§ Column <name>") and
``specification/attributes/<name>.md`` ("§ Attribute <name>").

Columns
    All names live in :class:`Column` only, so a later FOCUS version (1.3 renames ProviderName to
    ServiceProviderName and PublisherName to HostProviderName) is a change to that enum alone.
    Mandatory: the 21 columns in ``MANDATORY``. Conditional ones Tessera meets (it has resources, SKUs,
    regions, sub accounts, unit prices, tags and invoices): ``CONDITIONAL``. Recommended ones it fills:
    ChargeFrequency ('Usage-Based'), RegionName. Custom columns carry the ``x_`` prefix
    (§ Attribute Column Naming and Ordering).

Rules encoded
    * ChargePeriodStart is the inclusive and ChargePeriodEnd the exclusive bound (§ Column ChargePeriodStart,
      ChargePeriodEnd); times are written in UTC as ``YYYY-MM-DDTHH:MM:SSZ`` (§ Attribute Date/Time Format).
    * A line whose charge period lies inside the billing period is ChargeCategory 'Usage' with a null
      ChargeClass. A line whose charge period ended at or before the billing period start is late usage
      of a closed period: it is exported in the current billing period as ChargeCategory 'Adjustment',
      ChargeClass 'Correction' (§ Column ChargeClass: "MUST NOT be null when the row represents a correction
      to a previously invoiced billing period"); its charge period stays the original one and its InvoiceId
      is the current period's (as FOCUS 1.3 § Attribute Correction Handling spells out). A closed period is
      never rewritten. A line straddling the billing period start, or reaching past its end, is refused.
    * ConsumedQuantity/ConsumedUnit are null unless ChargeCategory is 'Usage' (§ Column ConsumedQuantity).
      PricingQuantity is kept on corrections too (only non-correction Usage/Purchase rows require it).
    * Costs are decimals in the billing currency with exactly its ISO 4217 exponent of places:
      minor units / 10**exponent (§ Attribute Currency Code Format, Numeric Format). ListCost = ContractedCost =
      the on-demand price x quantity (Tessera has no negotiated discounts); BilledCost = EffectiveCost also
      apply the spot discount, which makes PricingCategory 'Dynamic' (on-demand is 'Standard'; § Attribute
      Discount Handling). Each cost is rounded half-even once (pricing.py).
    * Quantities are GPU-Hours or GB-Hours (GB = 10**9 bytes; § Attribute Unit Format), rounded half-even to
      QUANTITY_PLACES places: 1/3600 hour has no finite decimal, so costs come from the exact value.
    * Null is an empty CSV cell (§ Attribute Null Handling); Tags is a JSON object (§ Attribute Key-Value Format).
"""
from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from enum import StrEnum
from fractions import Fraction
from typing import TextIO

from services.billing.domain import pricing
from services.billing.domain.pricing import PricingError, StoragePrice, UnitPrice

QUANTITY_PLACES = 9


class Column(StrEnum):
    """Every exported column, in output order. The only place column names are spelled."""
    BilledCost = "BilledCost"
    BillingAccountId = "BillingAccountId"
    BillingAccountName = "BillingAccountName"
    BillingCurrency = "BillingCurrency"
    BillingPeriodStart = "BillingPeriodStart"
    BillingPeriodEnd = "BillingPeriodEnd"
    ChargeCategory = "ChargeCategory"
    ChargeClass = "ChargeClass"
    ChargeDescription = "ChargeDescription"
    ChargePeriodStart = "ChargePeriodStart"
    ChargePeriodEnd = "ChargePeriodEnd"
    ContractedCost = "ContractedCost"
    EffectiveCost = "EffectiveCost"
    ListCost = "ListCost"
    InvoiceIssuer = "InvoiceIssuer"
    PricingQuantity = "PricingQuantity"
    PricingUnit = "PricingUnit"
    ProviderName = "ProviderName"
    PublisherName = "PublisherName"
    ServiceCategory = "ServiceCategory"
    ServiceName = "ServiceName"
    # conditional
    ConsumedQuantity = "ConsumedQuantity"
    ConsumedUnit = "ConsumedUnit"
    ResourceId = "ResourceId"
    ResourceName = "ResourceName"
    ResourceType = "ResourceType"
    SkuId = "SkuId"
    SkuPriceId = "SkuPriceId"
    SubAccountId = "SubAccountId"
    SubAccountName = "SubAccountName"
    RegionId = "RegionId"
    ListUnitPrice = "ListUnitPrice"
    ContractedUnitPrice = "ContractedUnitPrice"
    PricingCategory = "PricingCategory"
    Tags = "Tags"
    InvoiceId = "InvoiceId"
    # recommended
    ChargeFrequency = "ChargeFrequency"
    RegionName = "RegionName"
    # custom (x_ prefix)
    TenantId = "x_TenantId"
    GpuModel = "x_GpuModel"
    Shape = "x_Shape"
    Pool = "x_Pool"
    StorageClass = "x_StorageClass"


C = Column
COLUMNS: tuple[str, ...] = tuple(c.value for c in Column)
MANDATORY: frozenset[str] = frozenset(c.value for c in (
    C.BilledCost, C.BillingAccountId, C.BillingAccountName, C.BillingCurrency, C.BillingPeriodStart,
    C.BillingPeriodEnd, C.ChargeCategory, C.ChargeClass, C.ChargeDescription, C.ChargePeriodStart,
    C.ChargePeriodEnd, C.ContractedCost, C.EffectiveCost, C.ListCost, C.InvoiceIssuer, C.PricingQuantity,
    C.PricingUnit, C.ProviderName, C.PublisherName, C.ServiceCategory, C.ServiceName))
CONDITIONAL: frozenset[str] = frozenset(c.value for c in (
    C.ConsumedQuantity, C.ConsumedUnit, C.ResourceId, C.ResourceName, C.ResourceType, C.SkuId, C.SkuPriceId,
    C.SubAccountId, C.SubAccountName, C.RegionId, C.ListUnitPrice, C.ContractedUnitPrice, C.PricingCategory,
    C.Tags, C.InvoiceId))
CUSTOM: frozenset[str] = frozenset(c.value for c in Column if c.value.startswith("x_"))

GPU_HOURS = "GPU-Hours"
GB_HOURS = "GB-Hours"


class FocusError(PricingError):
    """A rated line cannot be exported as a FOCUS row; ``field`` names the offending field."""


def _utc(name: str, at: datetime) -> datetime:
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise FocusError(name, "must be a timezone-aware datetime")
    return at.astimezone(UTC)


def focus_datetime(at: datetime) -> str:
    """FOCUS Date/Time Format: ISO 8601 in UTC with a Z suffix, whole seconds."""
    return _utc("datetime", at).strftime("%Y-%m-%dT%H:%M:%SZ")


def money(minor: int, exponent: int) -> Decimal:
    """Minor units as a decimal with exactly ``exponent`` places (1234, 2 -> Decimal('12.34'))."""
    return Decimal(minor).scaleb(-exponent).quantize(Decimal(1).scaleb(-exponent))


def quantity(value: Fraction) -> Decimal:
    """An exact quantity written with QUANTITY_PLACES places, half to even."""
    places = Decimal(1).scaleb(-QUANTITY_PLACES)
    exact = Decimal(value.numerator) / Decimal(value.denominator)   # 28 significant digits, then quantized
    return exact.quantize(places, rounding=ROUND_HALF_EVEN)


def _seconds(start: datetime, end: datetime) -> Fraction:
    """Exact seconds in [start, end) (timedelta arithmetic is exact to the microsecond)."""
    td = _utc("end", end) - _utc("start", start)
    return Fraction((td.days * 86_400 + td.seconds) * 10**6 + td.microseconds, 10**6)


def _unit_price(micros: Fraction) -> Decimal:
    """Micros per unit-hour as an exact decimal in major units (the spot factor keeps it finite)."""
    d = Decimal(micros.numerator) / Decimal(micros.denominator) / pricing.MICROS
    return d.normalize() if d != d.to_integral_value() else d.quantize(Decimal(1))


@dataclass(frozen=True)
class BillingPeriod:
    """[start, end) of one billing period, and who bills it (the export's fixed columns)."""
    start: datetime
    end: datetime
    billing_account_id: str
    billing_account_name: str
    invoice_id: str | None = None
    provider: str = "Tessera"
    publisher: str = "Tessera"
    invoice_issuer: str = "Tessera"

    def __post_init__(self):
        if _utc("start", self.start) >= _utc("end", self.end):
            raise FocusError("end", "a billing period ends after it starts")


@dataclass(frozen=True)
class RatedLine:
    """One rated usage of one resource over [start, end): quantity in unit-hours and its two amounts.

    Build with :func:`gpu_line` or :func:`storage_line` so amounts come from the pricing rules."""
    tenant_id: str
    tenant_name: str
    resource_id: str
    resource_name: str
    resource_type: str
    start: datetime
    end: datetime
    quantity: Fraction                # exact unit-hours (GPU-hours or GB-hours)
    unit: str
    currency: str
    list_micros_per_unit_hour: Fraction
    list_minor: int
    billed_minor: int
    sku_id: str
    sku_price_id: str
    service_name: str
    service_category: str
    description: str
    spot: bool = False
    region: str | None = None
    gpu_model: str | None = None
    shape: str | None = None
    pool: str | None = None
    storage_class: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if _utc("start", self.start) >= _utc("end", self.end):
            raise FocusError("end", "a charge period ends after it starts")
        pricing.currency_exponent(self.currency)


def gpu_line(*, tenant_id: str, tenant_name: str, allocation_id: str, allocation_name: str, start: datetime,
             end: datetime, gpus: int, unit_price: UnitPrice, gpu_model: str | None, shape: str | None,
             pool: str | None, region: str | None = None, tags: Mapping[str, str] | None = None) -> RatedLine:
    """Rate ``gpus`` GPUs held over [start, end) at ``unit_price`` (list and, for spot, discounted)."""
    seconds = _seconds(start, end)
    list_micros = Fraction(unit_price.micros_per_gpu_hour)
    kind = f"{gpus} x {gpu_model or 'GPU'}" + (f", shape {shape}" if shape else "") + (f", pool {pool}" if pool else "")
    return RatedLine(
        tenant_id=tenant_id, tenant_name=tenant_name, resource_id=allocation_id, resource_name=allocation_name,
        resource_type="GPU Allocation", start=start, end=end, quantity=seconds * gpus / pricing.SECONDS_PER_HOUR,
        unit=GPU_HOURS, currency=unit_price.currency, list_micros_per_unit_hour=list_micros,
        list_minor=pricing.rate_gpu(seconds, gpus, unit_price, spot=False),
        billed_minor=pricing.rate_gpu(seconds, gpus, unit_price), sku_id=unit_price.sku_id,
        sku_price_id=unit_price.sku_price_id, service_name="Tessera GPU Compute", service_category="Compute",
        description=f"GPU-hours: {kind}" + (" (spot)" if unit_price.spot else ""), spot=unit_price.spot,
        region=region, gpu_model=gpu_model, shape=shape, pool=pool, tags=dict(tags or {}))


def storage_line(*, tenant_id: str, tenant_name: str, volume_id: str, volume_name: str, start: datetime,
                 end: datetime, size_bytes: int, class_price: StoragePrice, region: str | None = None,
                 tags: Mapping[str, str] | None = None) -> RatedLine:
    """Rate a volume of ``size_bytes`` held over [start, end) at its class's GB-hour price."""
    seconds = _seconds(start, end)
    byte_seconds = seconds * size_bytes
    micros = Fraction(class_price.micros_per_gb_hour)
    amount = pricing.rate_storage(byte_seconds, class_price)
    return RatedLine(
        tenant_id=tenant_id, tenant_name=tenant_name, resource_id=volume_id, resource_name=volume_name,
        resource_type="Volume", start=start, end=end,
        quantity=byte_seconds / (pricing.BYTES_PER_GB * pricing.SECONDS_PER_HOUR), unit=GB_HOURS,
        currency=class_price.currency, list_micros_per_unit_hour=micros,
        list_minor=amount, billed_minor=amount, sku_id=class_price.sku_id, sku_price_id=class_price.sku_price_id,
        service_name="Tessera Block Storage", service_category="Storage",
        description=f"GB-hours: {class_price.storage_class} volume", region=region,
        storage_class=class_price.storage_class, tags=dict(tags or {}))


def is_correction(line: RatedLine, period: BillingPeriod) -> bool:
    """True for late usage of a closed period (charge period ends at or before the billing period start).

    Raises FocusError for a line straddling the period start or reaching past the period end."""
    start, end = _utc("start", line.start), _utc("end", line.end)
    p_start, p_end = _utc("start", period.start), _utc("end", period.end)
    if end <= p_start:
        return True
    if start < p_start:
        raise FocusError("start", "line straddles the billing period start: split it at the boundary first")
    if end > p_end:
        raise FocusError("end", "line reaches past the billing period end (exclusive): split it or export later")
    return False


def focus_row(line: RatedLine, period: BillingPeriod) -> dict[str, object]:
    """One FOCUS row (column name -> value, None for null) for ``line`` exported in ``period``."""
    correction = is_correction(line, period)
    exponent = pricing.currency_exponent(line.currency)
    listed, billed = money(line.list_minor, exponent), money(line.billed_minor, exponent)
    consumed = None if correction else quantity(line.quantity)
    row = {
        C.BilledCost: billed, C.EffectiveCost: billed, C.ListCost: listed, C.ContractedCost: listed,
        C.BillingAccountId: period.billing_account_id, C.BillingAccountName: period.billing_account_name,
        C.BillingCurrency: line.currency,
        C.BillingPeriodStart: focus_datetime(period.start), C.BillingPeriodEnd: focus_datetime(period.end),
        C.ChargeCategory: "Adjustment" if correction else "Usage",
        C.ChargeClass: "Correction" if correction else None,
        C.ChargeDescription: line.description + (" (late usage of a closed period)" if correction else ""),
        C.ChargePeriodStart: focus_datetime(line.start), C.ChargePeriodEnd: focus_datetime(line.end),
        C.InvoiceIssuer: period.invoice_issuer, C.ProviderName: period.provider, C.PublisherName: period.publisher,
        C.PricingQuantity: quantity(line.quantity), C.PricingUnit: line.unit,
        C.ServiceCategory: line.service_category, C.ServiceName: line.service_name,
        C.ConsumedQuantity: consumed, C.ConsumedUnit: None if consumed is None else line.unit,
        C.ResourceId: line.resource_id, C.ResourceName: line.resource_name, C.ResourceType: line.resource_type,
        C.SkuId: line.sku_id, C.SkuPriceId: line.sku_price_id,
        C.SubAccountId: line.tenant_id, C.SubAccountName: line.tenant_name,
        C.RegionId: line.region, C.RegionName: line.region,
        C.ListUnitPrice: _unit_price(line.list_micros_per_unit_hour),
        C.ContractedUnitPrice: _unit_price(line.list_micros_per_unit_hour),
        C.PricingCategory: "Dynamic" if line.spot else "Standard",
        C.Tags: json.dumps(dict(line.tags), sort_keys=True, separators=(",", ":")),
        C.InvoiceId: period.invoice_id, C.ChargeFrequency: "Usage-Based",
        C.TenantId: line.tenant_id, C.GpuModel: line.gpu_model, C.Shape: line.shape, C.Pool: line.pool,
        C.StorageClass: line.storage_class,
    }
    return {c.value: row[c] for c in Column}


def focus_rows(lines: Iterable[RatedLine], period: BillingPeriod) -> list[dict[str, object]]:
    """Rows for every line, in order (see :func:`focus_row`)."""
    return [focus_row(line, period) for line in lines]


def write_csv(rows: Iterable[Mapping[str, object]], file: TextIO, columns: Iterable[str] = COLUMNS) -> None:
    """Write rows as CSV with a header: None is an empty cell (FOCUS null), a Decimal in plain notation with a
    fractional part, other values ``str()``.

    ``file`` is an open text file (open it with ``newline=''``); rows must not hold unknown columns."""
    names = list(columns)
    writer = csv.DictWriter(file, fieldnames=names, extrasaction="raise")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        # never exponent notation ('0E-9'); always a fractional part, so that a column whose values happen to be
        # whole ('4' USD per GPU-hour, costs in JPY) still reads as decimal, not integer, to a CSV reader
        text = format(value, "f")
        return text if "." in text else text + ".0"
    return str(value)
