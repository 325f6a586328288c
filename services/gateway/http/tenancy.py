"""A route's tenant: the one its path names must exist, and the caller must be one who may read it."""
from __future__ import annotations

import uuid

from aiohttp import web

from ..adapters import identity
from .auth import principal_of
from .inputs import path_uuid
from .problems import not_found


async def require_tenant(conn, tenant_id: uuid.UUID) -> None:
    """404 unless the tenant exists."""
    if not await identity.tenant_exists(conn, tenant_id):
        raise not_found("tenant")


def visible_tenant(request: web.Request) -> uuid.UUID:
    """The path's tenant if the caller may read it: provider admins any, members their own (404 otherwise)."""
    tenant_id = path_uuid(request, "tenant_id", "tenant")
    p = principal_of(request)
    if not p.is_provider_admin and p.tenant_id != tenant_id:
        raise not_found("tenant")
    return tenant_id
