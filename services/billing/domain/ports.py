"""The billing service's port: what its handlers need from storage, stated without any (pure, no I/O).

``adapters.repository.PgMeterRepository`` implements it on a unit of work's connection; the unit tests use an
in-memory fake. Nothing here commits: every change belongs to the caller's unit of work.
"""
from __future__ import annotations

import abc
import uuid

from .model import Meter


class MeterRepository(abc.ABC):
    """Usage meters, within one unit of work. An allocation has one meter per stretch it ran (a reschedule
    pauses its meter and starts a new one on the new node), and at most one of them running."""

    @abc.abstractmethod
    async def get_for_allocation(self, allocation_id: uuid.UUID) -> Meter | None:
        """The allocation's running meter as it is stored, else its last one (the latest started), or None if
        it has none.

        The allocation's meters stay locked against every other unit of work until this one ends (so a stop
        cannot race a stop, nor a start a start); the call waits while another unit of work holds them."""

    @abc.abstractmethod
    async def add(self, meter: Meter) -> None:
        """Store a new (running) meter. Its allocation must have no running one (a second running meter is an
        error, never a silent replacement); stopped ones stay as they are."""

    @abc.abstractmethod
    async def save_stop(self, meter: Meter) -> None:
        """Write back when a meter loaded with ``get_for_allocation`` stopped and the GPU-seconds it measured
        (nothing else of a meter ever changes)."""
