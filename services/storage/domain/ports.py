"""The storage service's port: what its handlers need from storage, stated without any (pure, no I/O).

``adapters.repository.PgVolumeRepository`` implements it on a unit of work's connection; the unit tests use an
in-memory fake (tests/support/fakes.py). Nothing here commits: every change belongs to the caller's unit of work.

Locks, always taken in this order within a unit of work: a volume id being created (``claim``), a tenant's quota
in a class (``lock_quota``), then volumes (``get(..., for_update=True)``, several in id order), so concurrent
units never deadlock.
"""
from __future__ import annotations

import abc
import uuid

from .model import Volume
from .quota import Limits, Usage


class VolumeRepository(abc.ABC):
    """Tenant volumes with their attachments, and quotas per (tenant, class) and user shares."""

    @abc.abstractmethod
    async def get(self, volume_id: uuid.UUID, *, for_update: bool = False) -> Volume | None:
        """The volume with its attachments (None: no such id); ``for_update`` locks it until the unit of work
        ends (the call waits while another holds it)."""

    @abc.abstractmethod
    async def claim(self, volume_id: uuid.UUID) -> None:
        """Serialise the units of work about ``volume_id`` until this one ends, even before a volume of that id
        exists (two creates of one id never both decide it is new). Taken before any other lock."""

    @abc.abstractmethod
    async def scratch_of(self, allocation_id: uuid.UUID) -> Volume | None:
        """The allocation's live scratch volume, locked, or None."""

    @abc.abstractmethod
    async def attached_to(self, allocation_id: uuid.UUID) -> list[uuid.UUID]:
        """The ids of the volumes with an attachment (any state) of the allocation, in id order."""

    @abc.abstractmethod
    async def name_taken(self, tenant_id: uuid.UUID, name: str) -> bool:
        """Whether a live volume of the tenant has that name."""

    @abc.abstractmethod
    async def lock_quota(self, tenant_id: uuid.UUID, storage_class: str) -> Limits:
        """Lock the tenant's quota in the class against every other unit of work until this one ends (creating
        its record on first use), so that reading use and adding or growing a volume after it is one decision.
        Returns the tenant's own limits (fields None where the defaults apply)."""

    @abc.abstractmethod
    async def user_share(self, tenant_id: uuid.UUID, storage_class: str, user_id: uuid.UUID) -> Limits | None:
        """The user's share of the tenant's quota in the class, or None when none was set."""

    @abc.abstractmethod
    async def usage(self, tenant_id: uuid.UUID, storage_class: str, user_id: uuid.UUID | None = None) -> Usage:
        """The sizes and the number of the tenant's live volumes in the class (only the user's, if given),
        scratch volumes included. Only as good as the quota lock: take it first when a decision depends on it."""

    @abc.abstractmethod
    async def add(self, volume: Volume) -> None:
        """Store a new volume (its id unused) with its attachments."""

    @abc.abstractmethod
    async def save(self, volume: Volume) -> None:
        """Store the volume's every field and exactly its attachments (those it no longer has are removed)."""

    @abc.abstractmethod
    async def set_quota(self, tenant_id: uuid.UUID, storage_class: str, user_id: uuid.UUID | None,
                        limits: Limits) -> int:
        """Set the tenant's limits in the class (user_id None) or the user's share; returns the record's new
        version (1 on the first set)."""

    @abc.abstractmethod
    async def live_volumes(self) -> list[Volume]:
        """Every volume that exists on a backend (available, in-use, error), without attachments, for the
        usage report."""

    @abc.abstractmethod
    async def record_usage(self, used: dict[uuid.UUID, int]) -> None:
        """Store what each volume uses (``used_bytes``); no version change."""
