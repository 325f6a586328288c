"""Tenants (provider admins) and their users (provider admins, or the tenant's own admins).

A tenant's ``weight`` (its plan: its share of each service's work while its messages wait with other tenants',
``shared.fairness``) is set by a provider admin; the gateway stamps it on every message it sends for the tenant,
and every message those cause inherits it. The replica that takes the change stamps it at once, the others
within ``WEIGHTS_REFRESH_S`` (``entrypoints.loops``)."""
from __future__ import annotations

import uuid

from aiohttp import web

from shared import fairness

from ...adapters import identity
from ...adapters.audit_state import StateReader, ids, select_object
from ...contracts import TenantCreated, UserCreated
from ...domain.keys import hash_api_key, new_api_key
from ...http.auth import principal_of, require_provider_admin
from ...http.endpoint import Endpoint, respond
from ...http.inputs import path_uuid, read_body
from ...http.params import TENANT_ID
from ...http.problems import ProblemError, forbidden, not_found
from ...http.state import gateway_of
from ...http.tenancy import require_tenant
from .schemas import TenantCreate, TenantList, TenantOut, TenantPatch, UserCreate, UserCreatedOut, UserList, UserOut


async def create_tenant(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    body = await read_body(request, TenantCreate)
    gw, tenant_id = gateway_of(request), uuid.uuid4()
    async with gw.unit_of_work("gateway.create_tenant") as uow:
        conn = uow.conn
        row = await identity.create_tenant(conn, tenant_id, body.name, admin.user_id, body.weight or 1)
        if row is None:
            raise ProblemError(409, f"a tenant named {body.name!r} already exists", slug="name-taken")
        fairness.weights.set(tenant_id, row["weight"])   # before the emit: its own message carries it
        await uow.emit("gateway.tenant_created", TenantCreated(tenant_id=tenant_id, name=body.name,
                            created_by=admin.user_id), correlation_id=str(tenant_id), tenant_id=tenant_id)
    return respond(TenantOut(**dict(row)), 201)


async def list_tenants(request: web.Request) -> web.Response:
    require_provider_admin(request)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await identity.list_tenants(conn)
    return respond(TenantList(items=[TenantOut(**dict(r)) for r in rows]))


async def update_tenant(request: web.Request) -> web.Response:
    require_provider_admin(request)
    tenant_id = path_uuid(request, "tenant_id", "tenant")
    body = await read_body(request, TenantPatch)
    async with gateway_of(request).unit_of_work("gateway.update_tenant") as uow:
        row = await identity.set_tenant_weight(uow.conn, tenant_id, body.weight)
        if row is None:
            raise not_found("tenant")
    fairness.weights.set(tenant_id, row["weight"])   # this replica at once; the others at their next refresh
    return respond(TenantOut(**dict(row)))


def _tenant_for_user_admin(request: web.Request) -> uuid.UUID:
    """The path's tenant, if the caller may manage its users (403 otherwise, whether or not it exists)."""
    tenant_id = path_uuid(request, "tenant_id", "tenant")
    if not principal_of(request).may_manage_users_of(tenant_id):
        raise forbidden("only a provider admin or this tenant's admin may manage its users")
    return tenant_id


async def create_user(request: web.Request) -> web.Response:
    tenant_id = _tenant_for_user_admin(request)
    body = await read_body(request, UserCreate)
    gw, caller = gateway_of(request), principal_of(request)
    user_id, key = uuid.uuid4(), new_api_key()
    async with gw.unit_of_work("gateway.create_user") as uow:
        conn = uow.conn
        await require_tenant(conn, tenant_id)
        row = await identity.create_user(conn, user_id, tenant_id, body.name, body.role, caller.user_id)
        if row is None:
            raise ProblemError(409, f"the tenant already has a user named {body.name!r}", slug="name-taken")
        await identity.add_api_key(conn, user_id, hash_api_key(key))
        await uow.emit("gateway.user_created", UserCreated(
            user_id=user_id, tenant_id=tenant_id, name=body.name, role=body.role, created_by=caller.user_id),
            correlation_id=str(user_id), tenant_id=tenant_id)
    return respond(UserCreatedOut(**dict(row), api_key=key), 201)


async def list_users(request: web.Request) -> web.Response:
    tenant_id = _tenant_for_user_admin(request)
    async with gateway_of(request).pool.acquire() as conn:
        await require_tenant(conn, tenant_id)
        rows = await identity.list_users(conn, tenant_id)
    return respond(UserList(items=[UserOut(**dict(r)) for r in rows]))


_TENANT = StateReader(select_object("tenants", "id = $1", "name", "weight"), ids("tenant_id"))

ENDPOINTS = [
    Endpoint("POST", "/v1/tenants", create_tenant, "createTenant", "Create a tenant (provider admin)", "tenants",
             {201: TenantOut}, body=TenantCreate, errors=(400, 401, 403, 409, 413, 415, 422)),
    Endpoint("GET", "/v1/tenants", list_tenants, "listTenants", "List tenants (provider admin)", "tenants",
             {200: TenantList}, errors=(401, 403)),
    Endpoint("PATCH", "/v1/tenants/{tenant_id}", update_tenant, "updateTenant",
             "Change a tenant's weight (provider admin)", "tenants", {200: TenantOut}, body=TenantPatch,
             params=(TENANT_ID,), errors=(400, 401, 403, 404, 413, 415, 422),
             description="The weight is the tenant's share of each service's work while its messages wait with "
                         "other tenants': it applies to the messages the gateway sends for the tenant from then "
                         "on (at once on the replica that took the change, within seconds on the others), and "
                         "to every message they cause.",
             audit_state=_TENANT),
    Endpoint("POST", "/v1/tenants/{tenant_id}/users", create_user, "createUser",
             "Create a tenant user or admin (provider admin, or the tenant's admin)", "tenants",
             {201: UserCreatedOut}, body=UserCreate, params=(TENANT_ID,), errors=(400, 401, 403, 404, 409, 413, 415, 422),
             description="The response carries the user's API key; it is shown once and only its hash is kept."),
    Endpoint("GET", "/v1/tenants/{tenant_id}/users", list_users, "listUsers",
             "List a tenant's users (provider admin, or the tenant's admin)", "tenants",
             {200: UserList}, params=(TENANT_ID,), errors=(401, 403, 404)),
]
