"""A tenant admin's split of the tenant's quota among its users, GPU and storage quotas alike: who may split
it, whose share it may set, and the rule every share follows (no limit above the tenant's own)."""
from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import asyncpg
from aiohttp import web

from ..adapters import inventory
from ..domain.model import Principal
from .auth import principal_of
from .inputs import path_uuid
from .problems import forbidden, not_found, validation_problem
from .schema_base import FieldError
from .tenancy import visible_tenant


@dataclass(frozen=True)
class Split:
    """Whose share of which tenant's quota a request sets, and who asks."""

    tenant_id: uuid.UUID
    user_id: uuid.UUID
    caller: Principal


def split_of(request: web.Request, quota: str) -> Split:
    """The path's tenant (404: one the caller may not read) and user; 403 unless the caller is the tenant's
    admin or a provider admin (``quota`` names what is split in the refusal)."""
    tenant_id = visible_tenant(request)
    caller = principal_of(request)
    if not caller.may_manage_users_of(tenant_id):
        raise forbidden(f"only this tenant's admin (or a provider admin) may split its {quota}")
    return Split(tenant_id, path_uuid(request, "user_id", "user"), caller)


async def require_member(conn: asyncpg.Connection, split: Split) -> None:
    """404 unless the user belongs to the tenant."""
    if not await inventory.user_in_tenant(conn, split.user_id, split.tenant_id):
        raise not_found("user")


def require_within(share: Mapping[str, int | None], tenant: Mapping[str, int | None]) -> None:
    """422 naming each limit of the user's ``share`` above the tenant's own (by field; None: no bound, either
    side)."""
    problems = [FieldError(field=field, message=f"must not exceed the tenant's limit {tenant[field]}", code="quota_rule")
                for field, value in share.items()
                if value is not None and tenant.get(field) is not None and value > tenant[field]]
    if problems:
        raise validation_problem(problems)
