"""The billing service's port: what its handlers need from storage, stated without any (pure, no I/O).

``adapters.repository.PgMeterRepository`` implements it on a unit of work's connection; the unit tests use an
in-memory fake. Nothing here commits: every change belongs to the caller's unit of work.
"""
from __future__ import annotations

import abc
import uuid
from datetime import datetime

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

    @abc.abstractmethod
    async def metered_from(self, allocation_id: uuid.UUID, at: datetime) -> bool:
        """Whether a meter of the allocation started at ``at`` (an activation already metered)."""

    @abc.abstractmethod
    async def add_activation(self, meter: Meter) -> None:
        """Store a meter started at an activation, running or already stopped (its stop came first). Like ``add``,
        its allocation must have no other running meter when it runs; at most one meter per start time."""

    @abc.abstractmethod
    async def keep_stop_ahead(self, allocation_id: uuid.UUID, at: datetime) -> None:
        """Keep a stop at ``at`` that found no meter of the allocation running: it overtook the activation it ends
        (kept once per time)."""

    @abc.abstractmethod
    async def take_stop_ahead(self, allocation_id: uuid.UUID, at: datetime) -> datetime | None:
        """Remove and return the earliest stop kept for the allocation at or after ``at`` (None: none)."""
