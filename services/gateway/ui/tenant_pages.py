"""The tenant's own pages: its networks and volumes, its usage, current invoice and budget, and (tenant admins
only) its audit trail. Each reads only the signed-in member's tenant (adapters/dashboard_tenant.py)."""
from __future__ import annotations

import json
from datetime import UTC, datetime

from aiohttp import web

from ..adapters import dashboard_tenant as repo
from ..adapters import volumes as volume_rows
from ..domain.keys import BadCursor, decode_cursor, encode_cursor
from ..domain.model import Principal
from ..http.problems import ProblemError, forbidden
from ..http.state import gateway_of

AUDIT_PAGE = 50


def tenant_of(p: Principal, admin: bool = False):
    """The member's tenant; 403 for the provider admin (these pages are a tenant's) and, where ``admin``, for a
    member who is not a tenant admin."""
    if p.is_provider_admin or p.tenant_id is None:
        raise forbidden("this page shows a tenant's own things; sign in as a tenant member")
    if admin and p.role != "tenant_admin":
        raise forbidden("the audit trail is for the tenant's admins")
    return p.tenant_id


async def resources(request: web.Request, p: Principal):
    tenant_id = tenant_of(p)
    async with gateway_of(request).pool.acquire() as conn:
        networks = await repo.networks(conn, tenant_id, 200)
        volumes = await volume_rows.page(conn, tenant_id, 200, None)   # the API's list: newest first
    return "resources.html", {"title": "Networks & volumes", "networks": networks, "volumes": volumes}


async def billing(request: web.Request, p: Principal):
    tenant_id = tenant_of(p)
    month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    async with gateway_of(request).pool.acquire() as conn:
        usage = await repo.usage_since(conn, tenant_id, month)
        invoice = await repo.current_invoice(conn, tenant_id)
        budget = await repo.budget(conn, tenant_id)
    doc = None
    if invoice is not None:
        doc = json.loads(invoice["doc"]) if isinstance(invoice["doc"], str) else dict(invoice["doc"])
    return "billing.html", {"title": "Usage & billing", "usage": usage, "invoice": invoice, "doc": doc,
                            "budget": budget, "month": month}


async def audit(request: web.Request, p: Principal):
    tenant_id = tenant_of(p, admin=True)
    raw = request.query.get("cursor")
    try:
        after = decode_cursor(raw) if raw else None
    except BadCursor:
        raise ProblemError(422, "not a cursor this dashboard returned") from None
    async with gateway_of(request).pool.acquire() as conn:
        rows = await repo.audit_page(conn, tenant_id, AUDIT_PAGE + 1, after)
    page = rows[:AUDIT_PAGE]
    cursor = encode_cursor(page[-1]["event_time"], page[-1]["id"]) if len(rows) > AUDIT_PAGE else None
    return "audit.html", {"title": "Audit trail", "records": page, "next": cursor}
