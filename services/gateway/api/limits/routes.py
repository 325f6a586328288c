"""A tenant's rate limits (docs/rate-limits.md): provider admins override the gateway's settings per tenant; the
tenant's admins read what is in force (the tenant's users get a 403, other tenants' members a 404).

The overrides are read by the limiter's own statement on every request, so a change applies on every replica at
the tenant's next request.
"""
from __future__ import annotations

import uuid

from aiohttp import web

from ...adapters import rate_limits as repo
from ...adapters.audit_state import StateReader, ids, select_object
from ...http.auth import principal_of, require_provider_admin
from ...http.endpoint import Endpoint, respond
from ...http.inputs import read_body
from ...http.params import TENANT_ID
from ...http.problems import forbidden
from ...http.ratelimit import Limits
from ...http.state import gateway_of
from ...http.tenancy import require_tenant, visible_tenant
from .schemas import EffectiveLimits, LimitOut, RateLimitsOut, RateLimitsSet


def _view(tenant_id: uuid.UUID, limits: Limits, sse_default: int, row) -> RateLimitsOut:
    def pick(name: str, default: int) -> int:
        return row[name] if row is not None and row[name] is not None else default

    def bucket(prefix: str, base) -> LimitOut:
        return LimitOut(per_s=pick(f"{prefix}_per_s", base.per_s), burst=pick(f"{prefix}_burst", base.burst))

    effective = EffectiveLimits(read=bucket("read", limits.tenant["read"]), write=bucket("write", limits.tenant["write"]),
                                user_read=bucket("user_read", limits.user["read"]),
                                user_write=bucket("user_write", limits.user["write"]),
                                sse_connections=pick("sse_connections", sse_default))
    overridden = [f for f in repo.OVERRIDE_FIELDS if row is not None and row[f] is not None]
    return RateLimitsOut(tenant_id=tenant_id, effective=effective, overridden=overridden,
                         set_by=row["set_by"] if row else None, set_at=row["set_at"] if row else None)


async def _answer(request: web.Request, conn, tenant_id: uuid.UUID) -> web.Response:
    gw = gateway_of(request)
    return respond(_view(tenant_id, Limits(gw.config), gw.config.sse_per_tenant, await repo.overrides(conn, tenant_id)))


async def get_rate_limits(request: web.Request) -> web.Response:
    tenant_id = visible_tenant(request)
    if not principal_of(request).may_manage_users_of(tenant_id):
        raise forbidden("only this tenant's admins (or a provider admin) may read its rate limits")
    async with gateway_of(request).pool.acquire() as conn:
        await require_tenant(conn, tenant_id)
        return await _answer(request, conn, tenant_id)


async def put_rate_limits(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    tenant_id = visible_tenant(request)
    body = await read_body(request, RateLimitsSet)
    async with gateway_of(request).unit_of_work("gateway.put_rate_limits") as uow:
        await require_tenant(uow.conn, tenant_id)
        await repo.set_overrides(uow.conn, tenant_id, body.model_dump(), admin.user_id)
        return await _answer(request, uow.conn, tenant_id)


async def delete_rate_limits(request: web.Request) -> web.Response:
    require_provider_admin(request)
    tenant_id = visible_tenant(request)
    async with gateway_of(request).unit_of_work("gateway.delete_rate_limits") as uow:
        await require_tenant(uow.conn, tenant_id)
        await repo.delete_overrides(uow.conn, tenant_id)
    return web.Response(status=204)


_PATH = "/v1/tenants/{tenant_id}/rate-limits"

_RATE_LIMITS = StateReader(select_object("tenant_rate_limits", "tenant_id = $1", "read_per_s", "read_burst",
                                         "write_per_s", "write_burst", "user_read_per_s", "user_read_burst",
                                         "user_write_per_s", "user_write_burst", "sse_connections", "set_by",
                                         "set_at"), ids("tenant_id"))


ENDPOINTS = [
    Endpoint("PUT", _PATH, put_rate_limits, "putRateLimits", "Override a tenant's rate limits (provider admin)",
             "tenants", {200: RateLimitsOut}, body=RateLimitsSet, params=(TENANT_ID,),
             errors=(400, 401, 403, 404, 413, 415, 422),
             description="Replaces the tenant's overrides whole; a field left out takes the gateway's setting again. "
                         "Applies at the tenant's next request, on every gateway replica. A bucket shrunk below what "
                         "it holds is cut to its new burst at the tenant's next request.",
             audit_state=_RATE_LIMITS),
    Endpoint("GET", _PATH, get_rate_limits, "getRateLimits", "Read a tenant's rate limits (the tenant's admins, or a "
             "provider admin)", "tenants", {200: RateLimitsOut}, params=(TENANT_ID,), errors=(401, 403, 404),
             description="The limits in force (overrides where set, else the gateway's settings) and which are "
                         "overridden. The tenant's users get 403, other tenants' members 404."),
    Endpoint("DELETE", _PATH, delete_rate_limits, "deleteRateLimits", "Remove a tenant's rate-limit overrides "
             "(provider admin)", "tenants", {204: None}, params=(TENANT_ID,), errors=(401, 403, 404),
             description="The gateway's settings apply again. Answered 204 whether or not any were set.",
             audit_state=_RATE_LIMITS),
]
