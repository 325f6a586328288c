"""Tenant volumes and their quotas (pure, no I/O).

A tenant's volumes together may not exceed its quota: its own limit when the
provider set one, the service's default otherwise.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime


class DomainError(Exception):
    """A command does not fit the storage rules."""


class QuotaExceeded(DomainError):
    """The volume would take the tenant past its quota."""


@dataclass(frozen=True)
class StoragePolicy:
    default_quota_gb: int = 100_000

    def __post_init__(self) -> None:
        if self.default_quota_gb < 0:
            raise ValueError(f"the default quota must be at least 0 GB, not {self.default_quota_gb}")


@dataclass(frozen=True)
class Quota:
    tenant_id: uuid.UUID
    limit_gb: int

    @classmethod
    def of(cls, tenant_id: uuid.UUID, explicit_gb: int | None, policy: StoragePolicy) -> "Quota":
        """The tenant's own limit if it has one, else the policy's default."""
        return cls(tenant_id, explicit_gb if explicit_gb is not None else policy.default_quota_gb)

    def check(self, used_gb: int, requested_gb: int) -> None:
        """Raise QuotaExceeded if ``requested_gb`` more would exceed the limit (reaching it exactly is fine)."""
        if used_gb + requested_gb > self.limit_gb:
            raise QuotaExceeded(
                f"quota exceeded for tenant {self.tenant_id}: {requested_gb} GB requested, "
                f"limit {self.limit_gb} GB, current use {used_gb} GB")


@dataclass(frozen=True)
class Volume:
    id: uuid.UUID
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    size_gb: int
    created_at: datetime
