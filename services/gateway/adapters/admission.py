"""The fast-fail checks a create passes before its command is sent: the tenant's GPU quota (the scheduler charges
it again, atomically, with the reservation), the provider's spend cap on the tenant, and the storage quota of a
class. Each raises a 403 problem naming what was exceeded (QuotaProblem, SpendCapProblem: the models the OpenAPI
document names). Shared by allocations, storage and the quota and budget routes."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg

from ..domain.model import Principal
from ..domain.scheduling import DEFAULT_POOL, QuotaBreach, ShapeInfo, quota_breach
from ..domain.volumes import Limits, Offer, StorageClass, storage_breach, tenant_limits
from ..http.problems import ProblemError, validation_problem
from ..http.schema_base import FieldError, Problem
from . import inventory
from . import volumes as repo


class QuotaProblem(Problem):
    """403 quota-exceeded: the quota that refuses the request, its limit, current use and the GPUs asked for."""

    quota: str
    limit: int
    used: int
    requested: int


class SpendCapProblem(Problem):
    """403 spend-cap-exceeded: the tenant's month-to-date rated spend reached the provider's cap."""

    limit: int
    used: int
    currency: str


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
    rows, models = await inventory.quota_rows(conn, p.tenant_id, pool, p.user_id, pool_models=not shape.gpu_model)
    if not rows:
        return
    breach = quota_breach(rows, tenant_id=p.tenant_id, user_id=p.user_id, pool=pool, gpu_model=shape.gpu_model,
                          pool_models=models, requested=shape.gpu_count)
    if breach is not None:
        raise QuotaExceeded(breach)


def month_start(now: datetime) -> datetime:
    """The start of ``now``'s calendar month, UTC."""
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


async def month_spend(conn: asyncpg.Connection, tenant_id: uuid.UUID, currency: str, now: datetime) -> int:
    """The tenant's rated spend in ``currency`` of usage records starting in ``now``'s UTC month (minor units)."""
    return await conn.fetchval(
        "SELECT coalesce(sum(amount_minor), 0)::bigint FROM usage_view WHERE tenant_id=$1 AND rated AND currency=$2 "
        "AND period_start >= $3", tenant_id, currency, month_start(now))


class SpendCapExceeded(ProblemError):
    """403 spend-cap-exceeded with the members ``limit``, ``used`` and ``currency`` (as quota-exceeded's)."""

    def __init__(self, limit: int, used: int, currency: str):
        super().__init__(403, f"the tenant's spend cap is reached: {used} of {limit} {currency} (minor units) this "
                              "month; new allocations are refused until the provider raises or removes it",
                         slug="spend-cap-exceeded", title="Spend cap exceeded")
        self.limit, self.used, self.currency = limit, used, currency

    def to_problem(self, instance: str | None = None) -> SpendCapProblem:
        return SpendCapProblem(**super().to_problem(instance).model_dump(), limit=self.limit, used=self.used,
                               currency=self.currency)


async def check_spend_cap(conn: asyncpg.Connection, tenant_id: uuid.UUID, now: datetime) -> None:
    """Raise SpendCapExceeded when the tenant has a cap and its month-to-date spend has reached it."""
    cap = await conn.fetchrow("SELECT amount_minor, currency FROM tenant_spend_caps WHERE tenant_id=$1", tenant_id)
    if cap is None:
        return
    used = await month_spend(conn, tenant_id, cap["currency"], now)
    if used >= cap["amount_minor"]:
        raise SpendCapExceeded(cap["amount_minor"], used, cap["currency"])


def class_problem(field: str, name: str | None, offer: Offer) -> Exception:
    offered = ", ".join(offer.names) or "none (no class was announced yet)"
    message = (f"no default storage class is offered; name one of: {offered}" if name is None
               else f"no storage class {name!r}; offered: {offered}")
    return validation_problem([FieldError(field=field, message=message, code="unknown_storage_class")])


async def offered_class(conn: asyncpg.Connection, name: str | None, field: str = "storage_class") -> tuple[Offer, StorageClass]:
    """The offer and the class ``name`` names (None: the default class); a 422 naming ``field`` and the offered
    classes otherwise."""
    offer = await repo.offer(conn)
    found = offer.find(name)
    if found is None:
        raise class_problem(field, name, offer)
    return offer, found


def limits_of(row: asyncpg.Record | None) -> tuple[int | None, int | None]:
    return (row["max_bytes"], row["max_volumes"]) if row is not None else (None, None)


async def charge(conn: asyncpg.Connection, tenant_id: uuid.UUID, user_id: uuid.UUID, storage_class: str, offer: Offer,
                 *, requested_bytes: int, requested_volumes: int, lock: bool = True) -> None:
    """Raise QuotaExceeded (403) when the tenant's or the user's quota in the class cannot take the request.

    ``lock``: hold the two quota rows until commit (tenant's first), so the count stays true until the caller's
    volume row is written; a request that changes nothing in the class's use may leave it False (a fast check)."""
    if lock:
        tenant_row, user_row = await repo.lock_quotas(conn, tenant_id, storage_class, user_id)
    else:
        tenant_row = await repo.quota_row(conn, tenant_id, storage_class)
        user_row = await repo.quota_row(conn, tenant_id, storage_class, user_id)
    tenant = (tenant_limits(*limits_of(tenant_row), offer), await repo.use_of(conn, tenant_id, storage_class))
    own = Limits(*limits_of(user_row))
    user = (own, await repo.use_of(conn, tenant_id, storage_class, user_id)) if own != Limits() else None
    breach = storage_breach(storage_class, tenant, user, requested_bytes=requested_bytes,
                            requested_volumes=requested_volumes)
    if breach is not None:
        raise QuotaExceeded(breach)
