"""Storage classes and storage quotas: every caller reads the classes the provider offers; provider admins set a
tenant's quota in a class, tenant admins split it among users, members read theirs (as for GPU quotas,
api/inventory/quotas.py); and the charge a volume's creation or growth takes against them.

The storage service applies every quota change and checks each volume against them atomically; the gateway
checks first, against its own view, atomically too (``charge`` holds the quota rows while it counts), so
concurrent requests never get past a limit together. Another tenant's quotas are a 404, never a 403.
"""
from __future__ import annotations

import uuid
from dataclasses import asdict

import asyncpg
from aiohttp import web

from services.storage.contracts import SetStorageQuota

from ...adapters import volumes as repo
from ...adapters.admission import limits_of
from ...adapters.audit_state import StateReader, select_object
from ...domain.scheduling import NIL
from ...domain.volumes import Offer, tenant_limits
from ...http.auth import require_provider_admin
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_uuid, path_value, read_body
from ...http.params import TENANT_ID, USER_ID
from ...http.problems import not_found
from ...http.quota_split import require_member, require_within, split_of
from ...http.schema_types import StorageClassName
from ...http.state import gateway_of
from ...http.tenancy import require_tenant, visible_tenant
from .schemas import (
    StorageClassList,
    StorageClassOut,
    StorageQuotaList,
    StorageQuotaOut,
    StorageQuotaSet,
    StorageQuotaSetOut,
    StorageShareOut,
)

STORAGE_CLASS = Param("storage_class", "path", "The storage class (GET /v1/storage-classes).", StorageClassName,
                      required=True)


async def list_storage_classes(request: web.Request) -> web.Response:
    async with gateway_of(request).pool.acquire() as conn:
        offer = await repo.offer(conn)
    return respond(StorageClassList(items=[StorageClassOut(**asdict(c)) for c in offer.classes],
                                    default_quota_bytes=offer.default_quota_bytes,
                                    default_quota_volumes=offer.default_quota_volumes))


def storage_quota_list(tenant_id: uuid.UUID, offer: Offer, rows: list, usage: list) -> StorageQuotaList:
    """Per class (offered, quota set, or holding volumes): effective limits, use, and the users' shares."""
    classes = sorted(set(offer.names) | {r["storage_class"] for r in rows} | {u["storage_class"] for u in usage})
    items = []
    for name in classes:
        own = next((r for r in rows if r["storage_class"] == name and r["user_id"] == NIL), None)
        limits = tenant_limits(*limits_of(own), offer)
        held = [u for u in usage if u["storage_class"] == name]
        shares = []
        for r in (r for r in rows if r["storage_class"] == name and r["user_id"] != NIL):
            mine = [u for u in held if u["user_id"] == r["user_id"]]
            shares.append(StorageShareOut(user_id=r["user_id"], max_bytes=r["max_bytes"], max_volumes=r["max_volumes"],
                                          provisioned_bytes=sum(u["provisioned_bytes"] for u in mine),
                                          volumes=sum(u["volumes"] for u in mine), version=r["version"]))
        items.append(StorageQuotaOut(
            tenant_id=tenant_id, storage_class=name, max_bytes=limits.max_bytes, max_volumes=limits.max_volumes,
            quota_set=own is not None and limits_of(own) != (None, None),
            provisioned_bytes=sum(u["provisioned_bytes"] for u in held), volumes=sum(u["volumes"] for u in held),
            used_bytes=sum(u["used_bytes"] for u in held), version=own["version"] if own else None, users=shares))
    return StorageQuotaList(items=items)


async def list_storage_quotas(request: web.Request) -> web.Response:
    tenant_id = visible_tenant(request)
    async with gateway_of(request).pool.acquire() as conn:
        await require_tenant(conn, tenant_id)
        offer = await repo.offer(conn)
        rows, usage = await repo.quotas_of(conn, tenant_id), await repo.usage_by_class(conn, tenant_id)
    return respond(storage_quota_list(tenant_id, offer, rows, usage))


async def _offered_or_404(conn: asyncpg.Connection, name: str) -> Offer:
    offer = await repo.offer(conn)
    if offer.find(name) is None:
        raise not_found("storage class")
    return offer


async def set_tenant_storage_quota(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    tenant_id = path_uuid(request, "tenant_id", "tenant")
    storage_class = path_value(request, STORAGE_CLASS)
    body = await read_body(request, StorageQuotaSet)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.set_tenant_storage_quota") as uow:
        await require_tenant(uow.conn, tenant_id)
        await _offered_or_404(uow.conn, storage_class)
        await uow.emit("storage.set_quota", SetStorageQuota(
            tenant_id=tenant_id, storage_class=storage_class, max_bytes=body.max_bytes, max_volumes=body.max_volumes,
            set_by=admin.user_id), correlation_id=f"storage-quota:{tenant_id}", tenant_id=tenant_id)
    return respond(StorageQuotaSetOut(tenant_id=tenant_id, storage_class=storage_class, max_bytes=body.max_bytes,
                                      max_volumes=body.max_volumes), 202)


async def set_user_storage_quota(request: web.Request) -> web.Response:
    """A tenant admin's split: the user must be the tenant's, each limit at most the tenant's (effective) one."""
    split = split_of(request, "storage quota")
    tenant_id, user_id = split.tenant_id, split.user_id
    storage_class = path_value(request, STORAGE_CLASS)
    body = await read_body(request, StorageQuotaSet)
    async with gateway_of(request).unit_of_work("gateway.set_user_storage_quota") as uow:
        await require_member(uow.conn, split)
        offer = await _offered_or_404(uow.conn, storage_class)
        tenant = tenant_limits(*limits_of(await repo.quota_row(uow.conn, tenant_id, storage_class)), offer)
        require_within({"max_bytes": body.max_bytes, "max_volumes": body.max_volumes}, asdict(tenant))
        await uow.emit("storage.set_quota", SetStorageQuota(
            tenant_id=tenant_id, storage_class=storage_class, user_id=user_id, max_bytes=body.max_bytes,
            max_volumes=body.max_volumes, set_by=split.caller.user_id),
            correlation_id=f"storage-quota:{tenant_id}", tenant_id=tenant_id)
    return respond(StorageQuotaSetOut(tenant_id=tenant_id, storage_class=storage_class, user_id=user_id,
                                      max_bytes=body.max_bytes, max_volumes=body.max_volumes), 202)


_WRITE_ERRORS = (400, 401, 403, 404, 413, 415, 422)

def _storage_quota(user: bool):
    def args(params: dict[str, str], _principal) -> tuple:
        return uuid.UUID(params["tenant_id"]), params["storage_class"], uuid.UUID(params["user_id"]) if user else NIL
    return args


_STORAGE_QUOTA = select_object("volume_quotas_view", "tenant_id = $1 AND storage_class = $2 AND user_id = $3",
                               "max_bytes", "max_volumes", "effective_max_bytes", "effective_max_volumes", "version")


ENDPOINTS = [
    Endpoint("GET", "/v1/storage-classes", list_storage_classes, "listStorageClasses",
             "List the storage classes the provider offers", "storage", {200: StorageClassList}, errors=(401,),
             description="Each class's backend and largest volume, which one is the default, and the quota a tenant "
                         "has in each class when none is set for it."),
    Endpoint("GET", "/v1/tenants/{tenant_id}/storage-quotas", list_storage_quotas, "listStorageQuotas",
             "Read a tenant's storage quotas and their use (the tenant's members, or a provider admin)", "quotas",
             {200: StorageQuotaList}, params=(TENANT_ID,), errors=(401, 404),
             description="Per storage class: the limits that apply (the provider's, else the defaults), the bytes "
                         "and number of live volumes they are charged with, what the storage systems report the "
                         "volumes use, and the users' shares. Another tenant's quotas are a 404."),
    Endpoint("PUT", "/v1/tenants/{tenant_id}/storage-quotas/{storage_class}", set_tenant_storage_quota,
             "setTenantStorageQuota", "Set a tenant's quota in one storage class (provider admin)", "quotas",
             {202: StorageQuotaSetOut}, body=StorageQuotaSet, params=(TENANT_ID, STORAGE_CLASS), errors=_WRITE_ERRORS,
             description="null: the default. Lowering a limit below current use blocks new volumes and growth; it "
                         "never destroys a volume. A class not offered is a 404.",
             audit_state=StateReader(_STORAGE_QUOTA, _storage_quota(user=False))),
    Endpoint("PUT", "/v1/tenants/{tenant_id}/users/{user_id}/storage-quotas/{storage_class}", set_user_storage_quota,
             "setUserStorageQuota", "Split the tenant's storage quota for one user (the tenant's admin)", "quotas",
             {202: StorageQuotaSetOut}, body=StorageQuotaSet, params=(TENANT_ID, USER_ID, STORAGE_CLASS),
             errors=_WRITE_ERRORS, description="The user must belong to the tenant; each limit must not exceed the "
                                               "tenant's own (a 422); null: no own limit (the tenant's applies).",
             audit_state=StateReader(_STORAGE_QUOTA, _storage_quota(user=True))),
]
