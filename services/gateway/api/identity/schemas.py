"""HTTP models of identity: the token exchange, tenants and their users."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from shared.fairness import MAX_WEIGHT

from ...domain.model import Role
from ...http.schema_base import Body, Out, integer, omittable, text

PersonName = text(63, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._@+-]*$")
TenantRole = Literal["tenant_admin", "tenant_user"]


# --- requests ---------------------------------------------------------------------------------------

Weight = integer(1, MAX_WEIGHT)
_WEIGHT = ("The tenant's share of each service's work while its messages wait with other tenants' (its plan): a "
           "tenant of weight 3 is served three messages for each one of a tenant of weight 1. Default 1.")


class TenantCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"id", "created_at", "created_by"})
    name: PersonName
    weight: Weight = omittable(description=_WEIGHT)


class TenantPatch(Body):
    """What a provider admin changes of a tenant."""

    server_owned: ClassVar[frozenset[str]] = frozenset({"id", "name", "created_at", "created_by"})
    weight: Weight = Field(description=_WEIGHT)


class UserCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"id", "tenant_id", "api_key", "created_at", "created_by"})
    name: PersonName
    role: TenantRole


# --- responses --------------------------------------------------------------------------------------

class TokenOut(Out):
    """A short-lived bearer token."""

    access_token: str
    token_type: Literal["Bearer"] = "Bearer"
    expires_in: int = Field(description="Seconds until the token expires.")


class TenantOut(Out):
    """A tenant."""

    id: uuid.UUID
    name: str
    weight: int = Field(description=_WEIGHT)
    created_at: datetime


class TenantList(Out):
    """Every tenant, oldest first."""

    items: list[TenantOut]


class UserOut(Out):
    """A user of a tenant (or a provider admin, without tenant)."""

    id: uuid.UUID
    tenant_id: uuid.UUID | None
    name: str
    role: Role
    created_at: datetime


class UserCreatedOut(UserOut):
    """The new user, with its API key (shown this once)."""

    api_key: str = Field(description="Shown once; only its hash is stored.")


class UserList(Out):
    """The tenant's users, oldest first (no keys)."""

    items: list[UserOut]
