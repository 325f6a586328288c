"""HTTP models of invoices, as billing publishes them (services.billing.contracts.InvoiceDoc): amounts are integer
minor units of their currency (its ISO 4217 exponent: cents for USD, yen for JPY), quantities exact decimal
strings in their unit."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

from pydantic import Field

from ...http.schema_base import Out

PERIOD_PATTERN = r"^[12][0-9]{3}-(0[1-9]|1[0-2])$"


class InvoiceAmount(Out):
    currency: str
    amount_minor: int


class InvoiceLineOut(Out):
    """One line: what it sums (kind, SKU, price), its quantity and amount."""
    line_key: str
    description: str
    kind: Literal["gpu", "storage"]
    correction: bool = Field(description="Late usage of a finalized period, billed on this invoice.")
    corrects_period: str | None = Field(description="The finalized period (YYYY-MM) a correction belongs to.")
    sku_price_id: str | None
    price_list_version: str | None
    unit: str = Field(description="'GPU-hours' or 'GB-hours'.")
    quantity: str = Field(description="Exact decimal, in unit.")
    amount_minor: int
    currency: str
    entries: int = Field(description="Ledger entries the line sums.")


class InvoiceSummary(Out):
    """An invoice without its lines."""
    invoice_id: uuid.UUID
    number: str
    tenant_id: uuid.UUID
    period: str = Field(description="The billing period, YYYY-MM (UTC).")
    period_start: datetime
    period_end: datetime
    status: Literal["draft", "finalized"] = Field(description="draft: its period or grace period runs and it may "
                                                               "still grow; finalized: it never changes again.")
    totals: list[InvoiceAmount]
    finalized_at: datetime | None
    content_hash: str | None = Field(description="SHA-256 of the finalized document's canonical JSON.")
    version: int
    updated_at: datetime
    links: dict[str, str]


class InvoiceOut(InvoiceSummary):
    """One invoice as billing holds it, with its lines."""
    grace_until: datetime = Field(description="Late usage until then is still billed on this invoice (draft).")
    lines: list[InvoiceLineOut]
    entries: int = Field(description="Ledger entries the invoice sums.")
    ledger_sum: list[InvoiceAmount] = Field(description="Sum of its ledger entries per currency (equals totals).")


class InvoicePage(Out):
    """A page of invoices, newest period first."""
    items: list[InvoiceSummary]
    next_cursor: str | None
