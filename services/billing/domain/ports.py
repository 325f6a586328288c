"""The billing service's port: what its handlers need from storage, stated without any (pure, no I/O).

``adapters.repository.PgMeterRepository`` implements it on a unit of work's connection; the unit tests use an
in-memory fake. Nothing here commits: every change belongs to the caller's unit of work.
"""
from __future__ import annotations

import abc
import uuid

from .model import Meter


class MeterRepository(abc.ABC):
    """Usage meters (at most one per allocation), within one unit of work."""

    @abc.abstractmethod
    async def get_for_allocation(self, allocation_id: uuid.UUID) -> Meter | None:
        """The allocation's meter as it is stored, or None if it has none.

        It stays locked against every other unit of work until this one ends (so a stop cannot race a stop);
        the call waits while another unit of work holds it."""

    @abc.abstractmethod
    async def add(self, meter: Meter) -> None:
        """Store a new (running) meter. Its allocation must have none yet (one meter per allocation: a second is
        an error, never a silent replacement)."""

    @abc.abstractmethod
    async def save_stop(self, meter: Meter) -> None:
        """Write back when a meter loaded with ``get_for_allocation`` stopped and the GPU-seconds it measured
        (nothing else of a meter ever changes)."""
