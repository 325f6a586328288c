"""Quotas: provider admins set a tenant's GPU quota per pool and model, tenant admins split it among users,
tenant members read theirs; and the fast-fail a POST /v1/allocations gets when its quota is already used up.

Another tenant's quotas are a 404, never a 403 (as for allocations). The scheduler applies every
change and charges quotas atomically with each reservation; these views follow its events.
"""
from __future__ import annotations

import uuid

from aiohttp import web

from services.scheduler.contracts import SetQuota

from ...adapters import inventory
from ...adapters.audit_state import StateReader, select_object
from ...domain.scheduling import NIL
from ...http.auth import require_provider_admin
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, path_value, read_body
from ...http.params import TENANT_ID, USER_ID
from ...http.quota_split import require_member, require_within, split_of
from ...http.schema_base import GpuModel, ShapeName
from ...http.state import gateway_of
from ...http.tenancy import require_tenant, visible_tenant
from .quota_schemas import QuotaList, QuotaOut, TenantQuotaSet, UserQuotaOut, UserQuotaSet, UserQuotaSetOut

POOL = Param("pool", "path", "The node pool.", ShapeName, required=True)
GPU_MODEL = Param("gpu_model", "path", "The GPU model (as the nodes report it, e.g. H100).", GpuModel, required=True)
_WRITE_ERRORS = (400, 401, 403, 404, 413, 415, 422)


async def set_tenant_quota(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    tenant_id = path_uuid(request, "tenant_id", "tenant")
    pool, model = path_value(request, POOL), path_value(request, GPU_MODEL)
    body = await read_body(request, TenantQuotaSet)   # guaranteed <= limit: the model says so
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.set_tenant_quota") as uow:
        conn = uow.conn
        await require_tenant(conn, tenant_id)
        current = await inventory.get_quota(conn, tenant_id, pool, model)
        await uow.emit("scheduler.set_quota", SetQuota(
            tenant_id=tenant_id, gpu_model=model, pool=pool, limit=body.limit, guaranteed=body.guaranteed,
            set_by=admin.user_id), correlation_id=f"quota:{tenant_id}", tenant_id=tenant_id)
    return respond(QuotaOut(tenant_id=tenant_id, pool=pool, gpu_model=model, limit=body.limit, guaranteed=body.guaranteed,
                            used=current["used"] if current else 0, version=current["version"] if current else None), 202)


def quota_list(tenant_id: uuid.UUID, rows: list[dict]) -> QuotaList:
    """Group quota rows by (pool, model): the tenant's own row, with its users' splits under it."""
    grouped: dict[tuple[str, str], QuotaOut] = {}
    for r in rows:
        key = (r["pool"], r["gpu_model"])
        entry = grouped.setdefault(key, QuotaOut(tenant_id=tenant_id, pool=key[0], gpu_model=key[1], limit=None))
        if r["user_id"] == NIL:
            entry.limit, entry.guaranteed, entry.used, entry.version = r["limit"], r["guaranteed"], r["used"], r["version"]
        else:
            entry.users.append(UserQuotaOut(user_id=r["user_id"], limit=r["limit"], used=r["used"], version=r["version"]))
    return QuotaList(items=[grouped[k] for k in sorted(grouped)])


async def list_quotas(request: web.Request) -> web.Response:
    tenant_id = visible_tenant(request)
    async with gateway_of(request).pool.acquire() as conn:
        await require_tenant(conn, tenant_id)
        rows = await inventory.tenant_quotas(conn, tenant_id)
    return respond(quota_list(tenant_id, rows))


async def set_user_quota(request: web.Request) -> web.Response:
    """A tenant admin's split: the user must be the tenant's, the limit at most the tenant's own."""
    split = split_of(request, "quota")
    tenant_id, user_id = split.tenant_id, split.user_id
    pool, model = path_value(request, POOL), path_value(request, GPU_MODEL)
    body = await read_body(request, UserQuotaSet)
    async with gateway_of(request).unit_of_work("gateway.set_user_quota") as uow:
        await require_member(uow.conn, split)
        own = await inventory.get_quota(uow.conn, tenant_id, pool, model)
        require_within({"limit": body.limit}, {"limit": own["limit"] if own else None})
        current = await inventory.get_quota(uow.conn, tenant_id, pool, model, user_id)
        await uow.emit("scheduler.set_quota", SetQuota(
            tenant_id=tenant_id, gpu_model=model, pool=pool, limit=body.limit, user_id=user_id,
            set_by=split.caller.user_id), correlation_id=f"quota:{tenant_id}", tenant_id=tenant_id)
    return respond(UserQuotaSetOut(tenant_id=tenant_id, user_id=user_id, pool=pool, gpu_model=model, limit=body.limit,
                                   used=current["used"] if current else 0,
                                   version=current["version"] if current else None), 202)


def _quota(user: bool):
    def args(params: dict[str, str], _principal) -> tuple:
        return (uuid.UUID(params["tenant_id"]), params["pool"], params["gpu_model"],
                uuid.UUID(params["user_id"]) if user else NIL)
    return args


_QUOTA = select_object("quotas_view", "tenant_id = $1 AND pool = $2 AND gpu_model = $3 AND user_id = $4",
                       '"limit"', "guaranteed", "used", "version")


ENDPOINTS = [
    Endpoint("GET", "/v1/tenants/{tenant_id}/quotas", list_quotas, "listQuotas",
             "Read a tenant's quotas and their use (the tenant's members, or a provider admin)", "quotas",
             {200: QuotaList}, params=(TENANT_ID,), errors=(401, 404),
             description="Per pool and GPU model: limit, guaranteed and used, with the users' splits. Another "
                         "tenant's quotas are a 404."),
    Endpoint("PUT", "/v1/tenants/{tenant_id}/quotas/{pool}/{gpu_model}", set_tenant_quota, "setTenantQuota",
             "Set a tenant's GPU quota for one pool and model (provider admin)", "quotas", {202: QuotaOut},
             body=TenantQuotaSet, params=(TENANT_ID, POOL, GPU_MODEL), errors=_WRITE_ERRORS,
             description="guaranteed must not exceed limit. Lowering a limit below current use blocks new "
                         "allocations and never evicts running ones.",
             audit_state=StateReader(_QUOTA, _quota(user=False))),
    Endpoint("PUT", "/v1/tenants/{tenant_id}/users/{user_id}/quotas/{pool}/{gpu_model}", set_user_quota,
             "setUserQuota", "Split the tenant's quota for one user (the tenant's admin)", "quotas",
             {202: UserQuotaSetOut}, body=UserQuotaSet, params=(TENANT_ID, USER_ID, POOL, GPU_MODEL),
             errors=_WRITE_ERRORS, description="The user must belong to the tenant; the limit must not exceed the "
                                               "tenant's own limit (422).",
             audit_state=StateReader(_QUOTA, _quota(user=True))),
]
