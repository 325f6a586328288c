"""Invoices as billing publishes them, for reads (STUB: filled in by the invoices work)."""
from __future__ import annotations

from services.billing import contracts as bc
from shared.unit_of_work import UnitOfWork


async def on_invoice_changed(ctx: UnitOfWork, data: bc.InvoiceChanged) -> None:
    return None
