"""Storage quotas (pure, no I/O): what a tenant may hold in one storage class, in bytes and in volumes, and
the share of it a tenant admin gave one of its users.

A tenant's limits in a class are its own where the provider set them, the service's defaults otherwise
(``StoragePolicy``). A user's share, where one was set, limits that user's volumes in the class on top of
the tenant's limits; a share field left unset is no limit of its own (the tenant's applies). Reaching a limit
exactly is fine; a request past it is refused with ``QuotaExceeded`` naming the quota (``storage:<class>:bytes``,
``storage:<class>:volumes``, ``storage:<class>:user:bytes``, ``storage:<class>:user:volumes``), its limit,
what is used and what was requested.
"""
from __future__ import annotations

from dataclasses import dataclass

from .model import Refused


@dataclass(frozen=True)
class Usage:
    """What a tenant's (or a user's) live volumes of one class take: their sizes summed, and their number."""

    bytes: int = 0
    volumes: int = 0


@dataclass(frozen=True)
class Limits:
    """Explicit limits as stored (None: not set)."""

    max_bytes: int | None = None
    max_volumes: int | None = None


class QuotaExceeded(Refused):
    """A request would take a tenant or a user past one of its limits."""

    def __init__(self, quota: str, limit: int, used: int, requested: int, unit: str):
        self.quota, self.limit, self.used, self.requested = quota, limit, used, requested
        super().__init__(f"quota {quota} exceeded: limit {_amount(limit, unit)}, used {_amount(used, unit)}, "
                         f"requested {_amount(requested, unit)}")


def _amount(n: int, unit: str) -> str:
    return f"{n} {unit[:-1] if n == 1 else unit}"


@dataclass(frozen=True)
class Quota:
    """The limits that apply to one tenant in one class, and to one of its users there if a share was set."""

    storage_class: str
    max_bytes: int
    max_volumes: int
    user: Limits | None = None       # the user's share (None: none set, only the tenant's limits apply)

    @classmethod
    def of(cls, storage_class: str, tenant: Limits, defaults: Limits, user: Limits | None = None) -> Quota:
        """The tenant's own limits where set, the defaults otherwise; ``user``: the user's share, if any."""
        return cls(storage_class, _or(tenant.max_bytes, defaults.max_bytes), _or(tenant.max_volumes, defaults.max_volumes),
                   user)

    def check(self, tenant_used: Usage, bytes_: int, volumes: int, user_used: Usage | None = None) -> None:
        """Raise QuotaExceeded when ``bytes_`` and ``volumes`` more would exceed a limit: the tenant's bytes,
        then its volume count, then the user's share (checked only when both a share and ``user_used`` are
        given). A request of 0 of something never breaches that limit (a resize asks for no volume)."""
        name = f"storage:{self.storage_class}"
        _check(f"{name}:bytes", self.max_bytes, tenant_used.bytes, bytes_, "bytes")
        _check(f"{name}:volumes", self.max_volumes, tenant_used.volumes, volumes, "volumes")
        if self.user is not None and user_used is not None:
            _check(f"{name}:user:bytes", self.user.max_bytes, user_used.bytes, bytes_, "bytes")
            _check(f"{name}:user:volumes", self.user.max_volumes, user_used.volumes, volumes, "volumes")


def _or(value: int | None, default: int | None) -> int:
    return value if value is not None else (default or 0)


def _check(quota: str, limit: int | None, used: int, requested: int, unit: str) -> None:
    if limit is not None and requested > 0 and used + requested > limit:
        raise QuotaExceeded(quota, limit, used, requested, unit)


def effective(own: Limits, fallback: Limits) -> tuple[int, int]:
    """(bytes, volumes) that apply: ``own`` where set, else ``fallback``'s (the defaults for a tenant, the
    tenant's effective limits for a user)."""
    return _or(own.max_bytes, fallback.max_bytes), _or(own.max_volumes, fallback.max_volumes)
