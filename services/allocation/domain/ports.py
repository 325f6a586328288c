"""The allocation service's port: what its handlers need from storage, stated without any (pure, no I/O).

``adapters.repository.PgAllocationRepository`` implements it on a unit of work's connection; the unit tests use
an in-memory fake. Nothing here commits: every change belongs to the caller's unit of work.
"""
from __future__ import annotations

import abc
import uuid

from .model import Allocation


class AllocationRepository(abc.ABC):
    """Allocations, read and written within one unit of work."""

    @abc.abstractmethod
    async def get_for_update(self, allocation_id: uuid.UUID) -> Allocation | None:
        """The allocation with this id as it is stored (no recorded events), or None if there is none.

        It stays locked against every other unit of work until this one ends, so that load → change → save
        cannot lose a concurrent update; the call waits while another unit of work holds it."""

    @abc.abstractmethod
    async def add(self, allocation: Allocation) -> bool:
        """Store a new allocation. Returns False, and changes nothing, when one with that id exists already
        (the stored one is kept as it is: a repeated request is not an error)."""

    @abc.abstractmethod
    async def save(self, allocation: Allocation) -> None:
        """Write back what the life cycle changes (state, node_id, failed_step, reason, updated_at, and the last
        interruption: interrupted_at, interrupt_category, reschedules) of an allocation loaded with
        ``get_for_update`` in this unit of work; the fields a request fixes (tenant, user, name, shape, GPUs,
        volume, labels, options, created_at) are never rewritten."""
