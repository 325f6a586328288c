"""The storage service's port: what its handlers need from storage, stated without any (pure, no I/O).

``adapters.repository.PgVolumeRepository`` implements it on a unit of work's connection; the unit tests use an
in-memory fake. Nothing here commits: every change belongs to the caller's unit of work.
"""
from __future__ import annotations

import abc
import uuid

from .model import Volume


class VolumeRepository(abc.ABC):
    """Tenant volumes (at most one per allocation) and tenant quotas, within one unit of work."""

    @abc.abstractmethod
    async def volume_for(self, allocation_id: uuid.UUID) -> Volume | None:
        """The allocation's volume, or None if it has none."""

    @abc.abstractmethod
    async def lock_quota(self, tenant_id: uuid.UUID) -> int | None:
        """Lock the tenant's quota against every other unit of work until this one ends (creating the tenant's
        quota record on its first use; the call waits while another unit of work holds it), so that reading the
        tenant's use and adding a volume after it are one decision.

        Returns the tenant's own limit in GB, or None when the service's default quota applies."""

    @abc.abstractmethod
    async def used_gb(self, tenant_id: uuid.UUID) -> int:
        """The GB the tenant's volumes take together (0 when it has none). Only as good as the quota lock:
        call ``lock_quota`` first when a decision depends on it."""

    @abc.abstractmethod
    async def add(self, volume: Volume) -> None:
        """Store a new volume. Its allocation must have none yet (one volume per allocation: a second is an
        error, never a silent replacement)."""

    @abc.abstractmethod
    async def delete_for(self, allocation_id: uuid.UUID) -> bool:
        """Delete the allocation's volume, freeing its GB; False (and no change) if it had none."""
