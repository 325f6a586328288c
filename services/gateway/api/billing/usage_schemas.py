"""HTTP models of price lists and usage. Prices are integer micros (millionths of the currency's major unit)
per GPU-hour or GB-hour (GB = 10**9 bytes); amounts are integer minor units (cents for USD); quantities are
exact decimal strings."""
from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import Field

from ...http.schema_base import Body, Instant, Int, Out, integer, text

MAX_MICROS = 10**15
Currency = text(3, min_length=3, pattern=r"^[A-Z]{3}$")
Selector = text(64, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
StorageClassKey = text(32, min_length=1, pattern=r"^[a-z0-9][a-z0-9-]*$")


class GpuPriceIn(Body):
    micros_per_gpu_hour: Int = Field(ge=0, le=MAX_MICROS, description="Micros per GPU-hour (3.60 USD: 3600000).")
    shape: Selector | None = Field(default=None, description="Most specific: a shape (names no gpu_model or pool).")
    gpu_model: Selector | None = None
    pool: Selector | None = None


class PriceListPut(Body):
    currency: Currency = Field(description="ISO 4217 code.")
    effective_from: Instant = Field(strict=False, description="RFC 3339 with an offset; not in the past.")
    gpu_prices: list[GpuPriceIn] = Field(default_factory=list, max_length=1000,
                                         description="Precedence: shape > gpu_model+pool > gpu_model > pool > default.")
    storage_prices: dict[StorageClassKey, integer(0, MAX_MICROS)] = Field(
        default_factory=dict, max_length=100, description="Storage class -> micros per GB-hour.")
    spot_discount_bps: integer(0, 10_000) = Field(default=0, description="Spot discount in basis points.")


class GpuPriceOut(Out):
    micros_per_gpu_hour: int
    shape: str | None = None
    gpu_model: str | None = None
    pool: str | None = None


class PriceListOut(Out):
    version: str
    currency: str
    effective_from: datetime
    gpu_prices: list[GpuPriceOut]
    storage_prices: dict[str, int]
    spot_discount_bps: int
    in_force: bool = Field(description="Whether this is the version in force now.")
    published_by: uuid.UUID | None = None
    published_at: datetime | None = None


class PriceListAccepted(Out):
    version: str
    status: str = Field(description="'publishing': billing stores it, or refuses it (GET /v1/price-lists).")


class PriceListRejectionOut(Out):
    version: str
    reason: str
    field: str | None = None
    at: datetime


class PriceListList(Out):
    items: list[PriceListOut]
    rejections: list[PriceListRejectionOut] = Field(description="Billing's latest refusals (provider admins only).")


class UsageGroupOut(Out):
    key: str | None = Field(description="The group's value (shape, GPU model, pool, or the day/hour start).")
    currency: str | None = Field(description="Null for unrated usage (no price list was in force).")
    gpu_seconds: str
    gb_hours: str
    amount_minor: int
    records: int
    unrated_records: int


class UsageReport(Out):
    tenant_id: uuid.UUID | None
    start: datetime
    end: datetime
    group_by: str | None
    groups: list[UsageGroupOut]


class LedgerVerificationOut(Out):
    """What recomputing the billing ledger found (billing.verify_ledger: chain and checkpoints)."""
    table: str = Field(description="The ledger verified.")
    ok: bool
    entries: int
    checkpoints: int
    first_bad_seq: int | None = Field(description="The first entry whose hash or link does not match.")
    bad_checkpoint: int | None = Field(description="The first checkpoint whose root does not match.")
    reason: str | None
    duration_ms: float
    verified_at: datetime
