"""In-memory fakes for unit tests of handlers (no I/O): a unit of work that records what it emits, and a fake
of each service's repository port.

FakeUnitOfWork       the kit's UnitOfWork with no connection; what a handler emits is checked against the
                     contracts exactly as the outbox checks it, then recorded (``emitted``) instead of written
factory(repo)        what a handler takes as ``repository=``: hands out ``repo`` whatever the connection
FakeAllocationRepository, FakeVolumeRepository, FakeMeterRepository
                     the allocation, storage and billing ports over dicts; each hands out copies, so a change
                     a handler does not save is not stored (as with the database)
"""
from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from services.allocation.domain.model import Allocation
from services.allocation.domain.ports import AllocationRepository
from services.billing.domain.model import Meter
from services.billing.domain.ports import MeterRepository
from services.storage.domain.model import Volume
from services.storage.domain.ports import VolumeRepository
from services.storage.domain.quota import Limits, Usage
from shared.contract import load_catalog
from shared.envelope import Envelope
from shared.outbox import Outbox
from shared.unit_of_work import UnitOfWork
from tests.support.bus import make_envelope


# --- the unit of work -----------------------------------------------------------------------------------------
class RecordingOutbox(Outbox):
    """The service's outbox without a table: every message is checked (contract, sender, subject, payload model)
    and its envelope built as the real outbox does, then kept in ``sent``."""

    def __init__(self, service: str):
        super().__init__(service, load_catalog())
        self.sent: list[Envelope] = []

    async def add_many(self, conn: Any, items: list[tuple[str, BaseModel, dict[str, str] | None]], *,
                       correlation_id: str, tenant_id: uuid.UUID | None = None,
                       causation: Envelope | None = None, sink: list | None = None,
                       pending: list | None = None) -> list[Envelope]:
        envelopes = []
        for type_, data, params in items:
            self.catalog.check_send(self.service, type_, self.catalog.message(type_).render_subject(**(params or {})))
            envelopes.append(self.envelope(type_, data, correlation_id=correlation_id, tenant_id=tenant_id,
                                           causation=causation))
        self.sent += envelopes
        return envelopes


class FakeUnitOfWork(UnitOfWork):
    """A unit of work of ``service`` handling ``command`` (a message of type ``type_``), as the consumer kit opens
    one, but with no connection: its emits are recorded in ``emitted``."""

    def __init__(self, service: str, type_: str, command: BaseModel):
        data = command.model_dump(mode="json")
        causation = make_envelope(type_, data, tenant_id=data.get("tenant_id"),
                                  correlation_id=data.get("allocation_id"))
        super().__init__(None, RecordingOutbox(service), name=f"fake:{type_}", causation=causation)  # type: ignore[arg-type]

    @property
    def emitted(self) -> list[Envelope]:
        return self.outbox.sent   # type: ignore[attr-defined]

    def types(self) -> list[str]:
        """The types of the messages emitted so far, in order."""
        return [env.type for env in self.emitted]

    def only(self, type_: str) -> Envelope:
        """The one message emitted, which must be of ``type_``."""
        assert self.types() == [type_], f"emitted {self.types()}, expected only {type_}"
        return self.emitted[0]


def factory(repo: Any) -> Callable[[Any], Any]:
    """A repository factory (what a handler takes as ``repository=``) that hands out ``repo`` for any connection."""
    return lambda _conn: repo


# --- allocation ------------------------------------------------------------------------------------------------
class FakeAllocationRepository(AllocationRepository):
    def __init__(self, *allocations: Allocation):
        self.rows: dict[uuid.UUID, Allocation] = {}
        for a in allocations:
            self.rows[a.id] = _stored(a)

    async def get_for_update(self, allocation_id: uuid.UUID) -> Allocation | None:
        return copy.deepcopy(self.rows.get(allocation_id))

    async def add(self, allocation: Allocation) -> bool:
        if allocation.id in self.rows:
            return False
        self.rows[allocation.id] = _stored(allocation)
        return True

    async def save(self, allocation: Allocation) -> None:
        row = self.rows[allocation.id]
        for name in ("state", "node_id", "failed_step", "reason", "updated_at", "interrupted_at", "interrupt_category",
                     "reschedules", "release_pending", "release_pending_by"):
            setattr(row, name, getattr(allocation, name))


def _stored(a: Allocation) -> Allocation:
    """A copy as a store keeps it: without the events it recorded."""
    a = copy.deepcopy(a)
    a.pull_events()
    return a


# --- storage ---------------------------------------------------------------------------------------------------
class FakeVolumeRepository(VolumeRepository):
    """Volumes by id, tenant limits by (tenant, class), user shares by (tenant, class, user); ``calls`` logs the
    quota calls by name (the order a quota decision takes)."""

    def __init__(self, *volumes: Volume, quotas: dict[tuple, Limits] | None = None,
                 shares: dict[tuple, Limits] | None = None):
        self.volumes: dict[uuid.UUID, Volume] = {v.id: copy.deepcopy(v) for v in volumes}
        self.quotas: dict[tuple, Limits] = dict(quotas or {})
        self.shares: dict[tuple, Limits] = dict(shares or {})
        self.versions: dict[tuple, int] = {}
        self.calls: list[str] = []

    async def get(self, volume_id: uuid.UUID, *, for_update: bool = False) -> Volume | None:
        return copy.deepcopy(self.volumes.get(volume_id))

    async def claim(self, volume_id: uuid.UUID) -> None:
        self.calls.append("claim")

    async def scratch_of(self, allocation_id: uuid.UUID) -> Volume | None:
        return copy.deepcopy(next((v for v in self.volumes.values()
                                   if v.scratch and v.allocation_id == allocation_id and v.live), None))

    async def attached_to(self, allocation_id: uuid.UUID) -> list[uuid.UUID]:
        return sorted(v.id for v in self.volumes.values() if v.attachment(allocation_id))

    async def name_taken(self, tenant_id: uuid.UUID, name: str) -> bool:
        return any(v.tenant_id == tenant_id and v.name == name and v.live for v in self.volumes.values())

    async def lock_quota(self, tenant_id: uuid.UUID, storage_class: str) -> Limits:
        self.calls.append("lock_quota")
        return self.quotas.setdefault((tenant_id, storage_class), Limits())

    async def user_share(self, tenant_id: uuid.UUID, storage_class: str, user_id: uuid.UUID) -> Limits | None:
        return self.shares.get((tenant_id, storage_class, user_id))

    async def usage(self, tenant_id: uuid.UUID, storage_class: str, user_id: uuid.UUID | None = None) -> Usage:
        self.calls.append("usage")
        mine = [v for v in self.volumes.values() if v.tenant_id == tenant_id and v.storage_class == storage_class
                and v.live and (user_id is None or v.user_id == user_id)]
        return Usage(sum(v.size_bytes for v in mine), len(mine))

    async def add(self, volume: Volume) -> None:
        self.calls.append("add")
        assert volume.id not in self.volumes, f"volume {volume.id} exists already"
        self.volumes[volume.id] = copy.deepcopy(volume)

    async def save(self, volume: Volume) -> None:
        assert volume.id in self.volumes, f"volume {volume.id} was never added"
        self.volumes[volume.id] = copy.deepcopy(volume)

    async def set_quota(self, tenant_id: uuid.UUID, storage_class: str, user_id: uuid.UUID | None,
                        limits: Limits) -> int:
        key = (tenant_id, storage_class) if user_id is None else (tenant_id, storage_class, user_id)
        (self.quotas if user_id is None else self.shares)[key] = limits
        self.versions[key] = self.versions.get(key, 0) + 1
        return self.versions[key]

    async def live_volumes(self) -> list[Volume]:
        return [copy.deepcopy(v) for v in self.volumes.values() if v.state in ("available", "in-use")]

    async def record_usage(self, used: dict[uuid.UUID, int]) -> None:
        for volume_id, n in used.items():
            self.volumes[volume_id].used_bytes = n


# --- billing ---------------------------------------------------------------------------------------------------
class FakeMeterRepository(MeterRepository):
    """Meters in the order they were added (``segments``); ``meters``: each allocation's latest."""

    def __init__(self, *meters: Meter):
        self.segments: list[Meter] = [copy.copy(m) for m in meters]
        self.stops_ahead: set[tuple[uuid.UUID, datetime]] = set()

    @property
    def meters(self) -> dict[uuid.UUID, Meter]:
        return {m.allocation_id: m for m in self.segments}

    def of(self, allocation_id: uuid.UUID) -> list[Meter]:
        return [m for m in self.segments if m.allocation_id == allocation_id]

    async def get_for_allocation(self, allocation_id: uuid.UUID) -> Meter | None:
        mine = self.of(allocation_id)
        running = [m for m in mine if m.running]
        return copy.copy((running or mine or [None])[-1])

    async def add(self, meter: Meter) -> None:
        assert not any(m.running for m in self.of(meter.allocation_id)), \
            f"allocation {meter.allocation_id} has a running meter already"
        self.segments.append(copy.copy(meter))

    async def save_stop(self, meter: Meter) -> None:
        [stored] = [m for m in self.segments if m.id == meter.id]
        stored.stopped_at = meter.stopped_at

    async def metered_from(self, allocation_id: uuid.UUID, at: datetime) -> bool:
        return any(m.started_at == at for m in self.of(allocation_id))

    async def add_activation(self, meter: Meter) -> None:
        assert not await self.metered_from(meter.allocation_id, meter.started_at), "one meter per start time"
        assert not meter.running or not any(m.running for m in self.of(meter.allocation_id)), \
            f"allocation {meter.allocation_id} has a running meter already"
        self.segments.append(copy.copy(meter))

    async def keep_stop_ahead(self, allocation_id: uuid.UUID, at: datetime) -> None:
        self.stops_ahead.add((allocation_id, at))

    async def take_stop_ahead(self, allocation_id: uuid.UUID, at: datetime) -> datetime | None:
        kept = sorted(t for a, t in self.stops_ahead if a == allocation_id and t >= at)
        if not kept:
            return None
        self.stops_ahead.discard((allocation_id, kept[0]))
        return kept[0]
