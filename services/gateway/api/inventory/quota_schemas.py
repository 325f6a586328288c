"""HTTP models of quotas: a tenant's quota, a user's split, the list, and the quota-exceeded problem."""
from __future__ import annotations

import uuid
from typing import ClassVar

from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from ...http.schema_base import Body, Int, Out, constraints

# --- requests ---------------------------------------------------------------------------------------

class TenantQuotaSet(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"used", "tenant_id", "pool", "gpu_model", "version"})
    model_config = ConfigDict(json_schema_extra=constraints("guaranteed <= limit"))
    limit: Int = Field(ge=0, le=1_000_000, description="GPUs of this model the tenant may hold in this pool.")
    guaranteed: Int = Field(default=0, ge=0, le=1_000_000,
                            description="GPUs never preempted for others: at most `limit` (a greater value is a 422).")

    @field_validator("guaranteed")
    @classmethod
    def _at_most_the_limit(cls, value: int, info: ValidationInfo) -> int:
        limit = info.data.get("limit")
        if limit is not None and value > limit:
            raise PydanticCustomError("quota_rule", "must not exceed limit ({limit})", {"limit": limit})
        return value


class UserQuotaSet(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"used", "tenant_id", "user_id", "pool", "gpu_model", "version"})
    limit: Int = Field(ge=0, le=1_000_000, description="The user's share of the tenant's quota (at most the tenant's "
                                                       "limit: a greater one is a 422).")


# --- responses --------------------------------------------------------------------------------------

class UserQuotaOut(Out):
    """A tenant admin's split of the tenant's quota for one user."""

    user_id: uuid.UUID
    limit: int
    used: int
    version: int | None = None


class QuotaOut(Out):
    """A tenant's quota for one GPU model in one pool, with its users' splits."""

    tenant_id: uuid.UUID
    pool: str
    gpu_model: str
    limit: int | None = Field(description="null: no tenant quota is set, so the tenant may not allocate there "
                                          "(only users' splits exist).")
    guaranteed: int = 0
    used: int = 0
    version: int | None = None
    users: list[UserQuotaOut] = Field(default_factory=list)


class QuotaList(Out):
    """The tenant's quotas, by pool and GPU model."""

    items: list[QuotaOut]


class UserQuotaSetOut(UserQuotaOut):
    """The requested split (the scheduler applies it; GET shows it once applied)."""

    tenant_id: uuid.UUID
    pool: str
    gpu_model: str


