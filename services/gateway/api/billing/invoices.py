"""Invoices, read from invoices_view (projected from ``billing.invoice_changed``): GET /v1/invoices (a page),
GET /v1/invoices/{invoice_id} (the document) and GET /v1/invoices/{invoice_id}/html (the same, rendered).

Who reads what: provider admins every invoice; a tenant admin its tenant's (another tenant's invoice is a 404,
never a 403, and is never listed); a tenant user none (403: invoices are the tenant admins' business).

The HTML rendering is self-contained (inline CSS, nothing fetched, served with a CSP allowing nothing else):
every value of the document goes through ``html.escape``; amounts are minor units written with their currency's
ISO 4217 exponent; a draft carries a DRAFT watermark, a correction line the period it corrects, a finalized
invoice its content hash.
"""
from __future__ import annotations

import html
import uuid
from datetime import UTC, datetime
from typing import Literal

import asyncpg
from aiohttp import web

from services.billing import contracts as bc
from services.billing.contracts.pricing import PricingError, currency_exponent, focus

from ...adapters.keyset import newest_first
from ...domain.model import Principal
from ...http.auth import principal_of
from ...http.endpoint import TEXT_HTML, Endpoint, Param, respond
from ...http.inputs import path_uuid, query_value
from ...http.paging import CURSOR, LIMIT, Position, read_page
from ...http.problems import forbidden, not_found
from ...http.schema_base import text
from ...http.state import gateway_of
from .invoice_schemas import PERIOD_PATTERN, InvoiceAmount, InvoiceLineOut, InvoiceOut, InvoicePage, InvoiceSummary

UTC = UTC
INVOICE_ID = Param("invoice_id", "path", "The invoice's id.", uuid.UUID, required=True)
TENANT = Param("tenant_id", "query", "Whose invoices (provider admins; tenant admins always read their own "
                                     "tenant's).", uuid.UUID)
STATUS = Param("status", "query", "Only invoices in this status.", Literal["draft", "finalized"])
PERIOD = Param("period", "query", "Only this billing period (a UTC calendar month, YYYY-MM).",
               text(7, min_length=7, pattern=PERIOD_PATTERN))
_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"


def month_bounds(period: str) -> tuple[datetime, datetime]:
    """[start, end) of the UTC month ``period`` (YYYY-MM, already matched by PERIOD_PATTERN)."""
    year, month = int(period[:4]), int(period[5:7])
    return datetime(year, month, 1, tzinfo=UTC), datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


def period_of(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m")


def invoice_reader(request: web.Request) -> Principal:
    """Provider admins and tenant admins; 403 for a tenant user."""
    p = principal_of(request)
    if not p.is_provider_admin and p.role != "tenant_admin":
        raise forbidden("invoices are for tenant admins and provider admins")
    return p


def scoped_tenant(p: Principal, named: uuid.UUID | None) -> uuid.UUID | None:
    """The tenant a read is narrowed to: a tenant admin's own (naming another is a 404), or the one a provider
    admin names (None: every tenant)."""
    if p.is_provider_admin:
        return named
    if p.tenant_id is None or (named is not None and named != p.tenant_id):
        raise not_found("tenant")
    return p.tenant_id


def _doc(row) -> bc.InvoiceDoc:
    raw = row["doc"]
    return bc.InvoiceDoc.model_validate_json(raw) if isinstance(raw, str) else bc.InvoiceDoc.model_validate(raw)


def _amounts(amounts: list[bc.Amount]) -> list[InvoiceAmount]:
    return [InvoiceAmount(currency=a.currency, amount_minor=a.amount_minor) for a in amounts]


def _summary_fields(d: bc.InvoiceDoc) -> dict:
    base = f"/v1/invoices/{d.invoice_id}"
    return dict(invoice_id=d.invoice_id, number=d.number, tenant_id=d.tenant_id, period=period_of(d.period_start),
                period_start=d.period_start, period_end=d.period_end, status=d.status, totals=_amounts(d.totals),
                finalized_at=d.finalized_at, content_hash=d.content_hash, version=d.version,
                updated_at=d.updated_at, links={"self": base, "html": f"{base}/html"})


def invoice_out(d: bc.InvoiceDoc) -> InvoiceOut:
    return InvoiceOut(**_summary_fields(d), grace_until=d.grace_until, entries=d.entries,
                      ledger_sum=_amounts(d.ledger_sum),
                      lines=[InvoiceLineOut(**line.model_dump()) for line in d.lines])


async def list_invoices(request: web.Request) -> web.Response:
    p = invoice_reader(request)
    tenant_id = scoped_tenant(p, query_value(request, TENANT))
    status, period = query_value(request, STATUS), query_value(request, PERIOD)
    start, end = month_bounds(period) if period else (None, None)

    async def invoices(conn: asyncpg.Connection, n: int, after: Position | None) -> list:
        return await newest_first(
            conn, "SELECT invoice_id AS id, period_start, doc FROM invoices_view WHERE ($1::uuid IS NULL OR tenant_id "
                  "= $1) AND ($2::text IS NULL OR status = $2) "
                  "AND ($3::timestamptz IS NULL OR (period_start >= $3 AND period_start < $4))",
            [tenant_id, status, start, end], n, after, time="period_start", key="invoice_id")
    items, next_cursor = await read_page(request, invoices, created="period_start")
    return respond(InvoicePage(items=[InvoiceSummary(**_summary_fields(_doc(r))) for r in items],
                               next_cursor=next_cursor))


async def _readable(request: web.Request) -> tuple[bc.InvoiceDoc, str]:
    """The invoice the caller may read, and its tenant's name; 404 for an unknown or another tenant's."""
    p = invoice_reader(request)
    invoice_id = path_uuid(request, "invoice_id", "invoice")
    async with gateway_of(request).pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT i.doc, t.name FROM invoices_view i LEFT JOIN tenants t ON t.id = i.tenant_id "
            "WHERE i.invoice_id = $1 AND ($2::uuid IS NULL OR i.tenant_id = $2)",
            invoice_id, None if p.is_provider_admin else p.tenant_id)
    if row is None:
        raise not_found("invoice")
    d = _doc(row)
    return d, row["name"] or str(d.tenant_id)


async def get_invoice(request: web.Request) -> web.Response:
    d, _ = await _readable(request)
    return respond(invoice_out(d))


async def get_invoice_html(request: web.Request) -> web.Response:
    d, tenant_name = await _readable(request)
    return web.Response(text=render_html(d, tenant_name), content_type=TEXT_HTML, charset="utf-8",
                        headers={"Content-Security-Policy": _CSP, "Cache-Control": "no-store",
                                 "X-Content-Type-Options": "nosniff"})


# --- the HTML rendering (pure) ----------------------------------------------------------------------------------

def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def format_amount(minor: int, currency: str) -> str:
    """``minor`` units as a decimal with the currency's exponent and thousands separators ('1,234.50 USD')."""
    try:
        exponent = currency_exponent(currency)
    except PricingError:
        exponent = 2
    return f"{focus.money(minor, exponent):,f} {currency}"


def _when(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if at else "—"


_STYLE = """body{font-family:system-ui,sans-serif;margin:2rem;color:#222;position:relative}
table{border-collapse:collapse;width:100%;margin:1rem 0}th,td{border-bottom:1px solid #ddd;padding:.4rem;text-align:left}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}tr.correction td{background:#fff6e0}
.watermark{position:fixed;top:35%;left:10%;font-size:9rem;color:rgba(200,0,0,.12);transform:rotate(-30deg);
pointer-events:none;z-index:-1}.hash{font-family:monospace;word-break:break-all}"""


def _line_row(line: bc.InvoiceLine) -> str:
    note = f" <em>(correction of {_e(line.corrects_period or 'a finalized period')})</em>" if line.correction else ""
    return (f'<tr class="{"correction" if line.correction else "usage"}"><td>{_e(line.description)}{note}</td>'
            f'<td>{_e(line.sku_price_id or "")}</td><td class="num">{_e(line.quantity)}</td><td>{_e(line.unit)}</td>'
            f'<td class="num">{_e(format_amount(line.amount_minor, line.currency))}</td></tr>')


def render_html(d: bc.InvoiceDoc, tenant_name: str) -> str:
    """The invoice as one self-contained HTML page (every value escaped)."""
    draft = d.status == "draft"
    status = ("<p><strong>DRAFT</strong>: this invoice may still change until "
              f"{_e(_when(d.grace_until))}.</p>" if draft else
              f"<p>Finalized {_e(_when(d.finalized_at))}. Content hash (SHA-256): "
              f'<span class="hash">{_e(d.content_hash or "—")}</span></p>')
    lines = "".join(_line_row(line) for line in d.lines) or '<tr><td colspan="5">No usage.</td></tr>'
    totals = "".join(f'<tr><th colspan="4">Total {_e(a.currency)}</th>'
                     f'<td class="num"><strong>{_e(format_amount(a.amount_minor, a.currency))}</strong></td></tr>'
                     for a in d.totals)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Invoice {_e(d.number)}</title><style>{_STYLE}</style></head><body>"
        + ('<div class="watermark" aria-hidden="true">DRAFT</div>' if draft else "")
        + f"<h1>Invoice {_e(d.number)}</h1>"
        f"<p>Billed to: {_e(tenant_name)} (tenant {_e(d.tenant_id)})<br>"
        f"Period: {_e(period_of(d.period_start))} ({_e(_when(d.period_start))} to {_e(_when(d.period_end))})<br>"
        f"Status: {_e(d.status.upper())} · version {_e(d.version)} · invoice id {_e(d.invoice_id)}</p>"
        + status
        + '<table><thead><tr><th>Description</th><th>SKU price</th><th class="num">Quantity</th><th>Unit</th>'
        '<th class="num">Amount</th></tr></thead>'
        f"<tbody>{lines}</tbody><tfoot>{totals}</tfoot></table>"
        f"<p>{_e(d.entries)} ledger entries. Issued by Tessera.</p></body></html>\n")


_WHO = "Provider admins read every invoice, tenant admins their tenant's (another tenant's is a 404); tenant users " \
       "are refused (403)."
ENDPOINTS = [
    Endpoint("GET", "/v1/invoices", list_invoices, "listInvoices", "List invoices, newest period first", "billing",
             {200: InvoicePage}, params=(TENANT, STATUS, PERIOD, LIMIT, CURSOR), errors=(401, 403, 404, 422),
             description="One invoice per tenant and UTC month, as billing publishes it: draft while its period and "
                         "grace period run (it grows), then finalized (never changed again). " + _WHO),
    Endpoint("GET", "/v1/invoices/{invoice_id}", get_invoice, "getInvoice", "Read an invoice", "billing",
             {200: InvoiceOut}, params=(INVOICE_ID,), errors=(401, 403, 404),
             description="The invoice with its lines (amounts in integer minor units, quantities exact decimals; "
                         "correction lines bill late usage of a finalized period). " + _WHO),
    Endpoint("GET", "/v1/invoices/{invoice_id}/html", get_invoice_html, "getInvoiceHtml",
             "Read an invoice as a self-contained HTML page", "billing", {200: TEXT_HTML}, params=(INVOICE_ID,),
             errors=(401, 403, 404),
             description="text/html (UTF-8), no external resources: amounts in the currency's decimals, a DRAFT "
                         "watermark on a draft, correction lines marked with the period they correct, the content "
                         "hash of a finalized invoice. " + _WHO),
]
