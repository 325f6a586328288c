"""Tenant volumes, their attachments and the provider's storage classes (pure, no I/O).

A volume's life::

    creating ──► available ◄──► in-use      in-use: an attachment holds it (attaching, attached or detaching)
        │            │
        ▼            ▼
    rejected     deleting ──► deleted       deleted: a tombstone; its name is free again, its data destroyed
                     │
                     ▼
                   error ──► deleting       error: the backend refused the delete; destroy may be tried again

``creating`` and ``deleting`` last while the backend works, inside the unit of work that decides the outcome (so
they are not published today). ``rejected`` is a create refused (over quota, unknown class, the backend's
refusal): nothing of it exists on a backend. A refused resize, destroy or attach leaves the volume as it was
with ``reason`` set. Every change bumps ``version`` (``touch``), which the service publishes with the whole
volume.

Attach rules: the volume must be the tenant's and live (available, or in-use if it is shared); a volume that is
not shared has at most one attachment (a failed one does not count: it is kept only to show its reason).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

GB = 10 ** 9
MAX_VOLUME_BYTES = 1 << 50
DEAD = ("deleted", "rejected")                       # states that hold nothing and count against no quota
ACTIVE = ("attaching", "attached", "detaching")      # attachment states that hold the volume
VolumeState = Literal["creating", "available", "in-use", "deleting", "deleted", "rejected", "error"]
AttachmentState = Literal["attaching", "attached", "detaching", "failed"]


class DomainError(Exception):
    """A command does not fit the storage rules."""


class Refused(DomainError):
    """A request no retry can fix; ``reason`` (str of it) says why, for the tenant."""

    @property
    def reason(self) -> str:
        return str(self)


@dataclass(frozen=True)
class StorageClass:
    """A class of volumes the provider offers, served by one backend."""

    name: str
    backend: str                               # btrfs, lustre, vast or weka
    description: str = ""
    max_volume_bytes: int = MAX_VOLUME_BYTES
    default: bool = False
    simulated: bool = False                    # the backend renders and records its calls: no appliance is reached


@dataclass(frozen=True)
class StoragePolicy:
    """The classes on offer (exactly one the default) and the quota of a tenant without its own, per class."""

    classes: tuple[StorageClass, ...] = (StorageClass("standard", "btrfs", default=True),)
    default_quota_bytes: int = 100_000 * GB
    default_quota_volumes: int = 100

    def __post_init__(self) -> None:
        if self.default_quota_bytes < 0 or self.default_quota_volumes < 0:
            raise ValueError("the default quotas must be at least 0")
        if not self.classes or sum(c.default for c in self.classes) != 1:
            raise ValueError("exactly one storage class must be the default")

    def klass(self, name: str | None) -> StorageClass:
        """The class ``name`` (None: the default); Refused naming the classes on offer when there is none."""
        if name is None:
            return next(c for c in self.classes if c.default)
        for c in self.classes:
            if c.name == name:
                return c
        raise Refused(f"unknown storage class {name!r}; offered: {', '.join(c.name for c in self.classes)}")


@dataclass
class Attachment:
    """A volume mounted (or being mounted) into an allocation's slots; ``client``: the slot's address the
    backend lets in (None: none was given)."""

    allocation_id: uuid.UUID
    mode: Literal["rw", "ro"]
    state: AttachmentState
    node_id: uuid.UUID | None = None
    client: str | None = None
    reason: str | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


@dataclass
class Volume:
    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    storage_class: str
    backend: str
    size_bytes: int
    state: VolumeState
    created_at: datetime
    updated_at: datetime
    user_id: uuid.UUID | None = None
    used_bytes: int | None = None
    shared: bool = False
    scratch: bool = False
    allocation_id: uuid.UUID | None = None     # a scratch volume's allocation
    reason: str | None = None
    export_source: str | None = None
    export_options: dict[str, str] = field(default_factory=dict)
    version: int = 0                           # 0: never stored
    attachments: list[Attachment] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.state not in DEAD

    def active(self) -> list[Attachment]:
        return [a for a in self.attachments if a.active]

    def attachment(self, allocation_id: uuid.UUID) -> Attachment | None:
        return next((a for a in self.attachments if a.allocation_id == allocation_id), None)

    def touch(self, now: datetime, reason: str | None = None) -> None:
        """Record a change: the version grows, ``reason`` replaces the last one, and a volume that is available
        or in-use becomes whichever its attachments make it."""
        self.version += 1
        self.updated_at = now
        self.reason = reason
        if self.state in ("available", "in-use"):
            self.state = "in-use" if self.active() else "available"

    # -- rules -----------------------------------------------------------------------------------------------
    def check_attach(self, tenant_id: uuid.UUID, allocation_id: uuid.UUID) -> Attachment | None:
        """The allocation's attachment when it has one already (a repeat), else None when it may attach;
        Refused otherwise."""
        if tenant_id != self.tenant_id or not self.live:
            raise Refused(f"volume {self.id} not found")
        mine = self.attachment(allocation_id)
        if mine is not None and mine.active:
            return mine
        if self.state not in ("available", "in-use"):
            raise Refused(f"volume {self.name!r} is {self.state}, not available")
        others = [a.allocation_id for a in self.active() if a.allocation_id != allocation_id]
        if others and not self.shared:
            raise Refused(f"volume {self.name!r} is attached to allocation {others[0]} and is not shared")
        return None

    def attach(self, allocation_id: uuid.UUID, mode: Literal["rw", "ro"], state: AttachmentState, *,
               node_id: uuid.UUID | None, client: str | None) -> Attachment:
        """Add the allocation's attachment (replacing a failed one); call ``check_attach`` first."""
        self.attachments = [a for a in self.attachments if a.allocation_id != allocation_id]
        att = Attachment(allocation_id, mode, state, node_id, client)
        self.attachments.append(att)
        return att

    def detach(self, allocation_id: uuid.UUID) -> Attachment | None:
        """Remove the allocation's attachment; returns it (None: there was none)."""
        att = self.attachment(allocation_id)
        if att is not None:
            self.attachments.remove(att)
        return att

    def client_in_use(self, client: str | None, *, besides: uuid.UUID) -> bool:
        """Whether another active attachment than ``besides``'s lets the same client in (then keep it allowed)."""
        return any(a.client == client for a in self.active() if a.allocation_id != besides)

    def check_resize(self, size_bytes: int, klass: StorageClass) -> bool:
        """Whether growing to ``size_bytes`` changes anything (False: the size already); Refused for a shrink,
        a size over the class's maximum, or a volume that is not available or in-use."""
        if self.state not in ("available", "in-use"):
            raise Refused(f"volume {self.name!r} is {self.state}; only an available or in-use volume can grow")
        if size_bytes < self.size_bytes:
            raise Refused(f"volume {self.name!r} cannot shrink from {self.size_bytes} to {size_bytes} bytes; "
                          "a volume only grows")
        check_size(size_bytes, klass)
        return size_bytes > self.size_bytes

    def check_destroy(self) -> None:
        """Refused while an allocation has it attached (or is attaching or detaching it)."""
        held = self.active()
        if held:
            raise Refused(f"volume {self.name!r} is attached to {len(held)} allocation(s) "
                          f"({', '.join(str(a.allocation_id) for a in held)}); detach it first")


def check_size(size_bytes: int, klass: StorageClass) -> None:
    """Refused when a volume of ``size_bytes`` is larger than ``klass`` allows."""
    if size_bytes > klass.max_volume_bytes:
        raise Refused(f"{size_bytes} bytes is more than storage class {klass.name!r} allows for one volume "
                      f"({klass.max_volume_bytes} bytes)")


SCRATCH_IDS = uuid.UUID("6f1c2a8e-1d43-5b7e-9a35-2c0f4e7d8b91")


def scratch_id(allocation_id: uuid.UUID) -> uuid.UUID:
    """The allocation's scratch volume id, the same on every try: a try that rolled back after its backend made
    the volume is repeated on the same backend volume, never leaving a second one behind."""
    return uuid.uuid5(SCRATCH_IDS, str(allocation_id))


def scratch_name(allocation_id: uuid.UUID, taken: bool = False) -> str:
    """The scratch volume's name: ``scratch-<first 8 hex digits of the allocation id>``, or all 32 of them when
    that name is taken in the tenant already."""
    return f"scratch-{allocation_id.hex if taken else allocation_id.hex[:8]}"
