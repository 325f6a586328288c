"""Quotas: provider admins set a tenant's GPU quota per pool and model, tenant admins split it among users,
tenant members read theirs; and the fast-fail a POST /v1/allocations gets when its quota is already used up.

Another tenant's quotas are a 404, never a 403 (as for allocations). The scheduler applies every
change and charges quotas atomically with each reservation; these views follow its events.
"""
from __future__ import annotations

import uuid

import asyncpg
from aiohttp import web

from services.scheduler.contracts import SetQuota

from ...adapters import inventory
from ...domain.model import Principal
from ...domain.scheduling import DEFAULT_POOL, NIL, QuotaBreach, ShapeInfo, quota_breach
from ...http.auth import principal_of, require_provider_admin
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, path_value, read_body
from ...http.problems import ProblemError, forbidden, not_found, validation_problem
from ...http.schema_base import FieldError, GpuModel, ShapeName
from .quota_schemas import (QuotaList, QuotaOut, QuotaProblem, TenantQuotaSet, UserQuotaOut, UserQuotaSet,
                            UserQuotaSetOut)
from ...http.state import gateway_of
from ..identity.tenants import TENANT_ID, require_tenant

USER_ID = Param("user_id", "path", "The user's id (a user of this tenant).", uuid.UUID, required=True)
POOL = Param("pool", "path", "The node pool.", ShapeName, required=True)
GPU_MODEL = Param("gpu_model", "path", "The GPU model (as the nodes report it, e.g. H100).", GpuModel, required=True)
_WRITE_ERRORS = (400, 401, 403, 404, 413, 415, 422)


class QuotaExceeded(ProblemError):
    """403 quota-exceeded with the members ``quota``, ``limit``, ``used`` and ``requested``."""

    def __init__(self, breach: QuotaBreach):
        super().__init__(403, f"quota {breach.quota} exceeded: limit {breach.limit}, used {breach.used}, "
                              f"requested {breach.requested}", slug="quota-exceeded", title="Quota exceeded")
        self.breach = breach

    def to_problem(self, instance: str | None = None) -> QuotaProblem:
        b = self.breach
        return QuotaProblem(**super().to_problem(instance).model_dump(), quota=b.quota, limit=b.limit, used=b.used,
                            requested=b.requested)


async def check_quota(conn: asyncpg.Connection, p: Principal, shape: ShapeInfo, pool: str | None) -> None:
    """Raise QuotaExceeded when the quota view proves the request cannot be admitted (see quota_breach)."""
    pool = pool or DEFAULT_POOL
    rows = await inventory.quota_rows(conn, p.tenant_id, pool, p.user_id)
    if not rows:
        return
    models = [] if shape.gpu_model else await inventory.pool_models(conn, pool)
    breach = quota_breach(rows, tenant_id=p.tenant_id, user_id=p.user_id, pool=pool, gpu_model=shape.gpu_model,
                          pool_models=models, requested=shape.gpu_count)
    if breach is not None:
        raise QuotaExceeded(breach)


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


def visible_tenant(request: web.Request) -> uuid.UUID:
    """The path's tenant if the caller may read it: provider admins any, members their own (404 otherwise)."""
    tenant_id = path_uuid(request, "tenant_id", "tenant")
    p = principal_of(request)
    if not p.is_provider_admin and p.tenant_id != tenant_id:
        raise not_found("tenant")
    return tenant_id


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
    tenant_id = visible_tenant(request)
    caller = principal_of(request)
    if not caller.may_manage_users_of(tenant_id):
        raise forbidden("only this tenant's admin (or a provider admin) may split its quota")
    user_id = path_uuid(request, "user_id", "user")
    pool, model = path_value(request, POOL), path_value(request, GPU_MODEL)
    body = await read_body(request, UserQuotaSet)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.set_user_quota") as uow:
        conn = uow.conn
        if not await inventory.user_in_tenant(conn, user_id, tenant_id):
            raise not_found("user")
        own = await inventory.get_quota(conn, tenant_id, pool, model)
        if own is not None and body.limit > own["limit"]:
            raise validation_problem([FieldError(field="limit", message=f"must not exceed the tenant's limit {own['limit']}",
                                                 code="quota_rule")])
        current = await inventory.get_quota(conn, tenant_id, pool, model, user_id)
        await uow.emit("scheduler.set_quota", SetQuota(
            tenant_id=tenant_id, gpu_model=model, pool=pool, limit=body.limit, user_id=user_id, set_by=caller.user_id),
            correlation_id=f"quota:{tenant_id}", tenant_id=tenant_id)
    return respond(UserQuotaSetOut(tenant_id=tenant_id, user_id=user_id, pool=pool, gpu_model=model, limit=body.limit,
                                   used=current["used"] if current else 0,
                                   version=current["version"] if current else None), 202)


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
                         "allocations and never evicts running ones."),
    Endpoint("PUT", "/v1/tenants/{tenant_id}/users/{user_id}/quotas/{pool}/{gpu_model}", set_user_quota,
             "setUserQuota", "Split the tenant's quota for one user (the tenant's admin)", "quotas",
             {202: UserQuotaSetOut}, body=UserQuotaSet, params=(TENANT_ID, USER_ID, POOL, GPU_MODEL),
             errors=_WRITE_ERRORS, description="The user must belong to the tenant; the limit must not exceed the "
                                               "tenant's own limit (422)."),
]
