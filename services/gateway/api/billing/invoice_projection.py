"""Invoices as billing publishes them, for reads: invoices_view, fed by ``billing.invoice_changed`` (in the
consumer's transaction, inbox-deduped).

Billing sends an invoice again whenever it changes, its ``version`` growing; events may arrive in any order
(a redelivery, a replay), so a document replaces the one shown only when its version is higher. An invoice
never moves to another tenant: a document naming another tenant for a known invoice id is ignored."""
from __future__ import annotations

import json

from services.billing import contracts as bc
from shared.unit_of_work import UnitOfWork

from ...adapters.versioned import upsert_newer

_INVOICE = upsert_newer("invoices_view", ["invoice_id"], ["invoice_id", "tenant_id", "number", "period_start", "status",
                                                          "version", "doc", "updated_at"],
                        jsonb={"doc"}, same=["tenant_id"])


async def on_invoice_changed(ctx: UnitOfWork, data: bc.InvoiceChanged) -> None:
    inv = data.invoice
    await ctx.conn.execute(
        _INVOICE, inv.invoice_id, inv.tenant_id, inv.number, inv.period_start, inv.status, inv.version,
        json.dumps(inv.model_dump(mode="json")), inv.updated_at)
