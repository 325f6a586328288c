"""The one storage-backend interface: a tenant volume made real on a storage system.

A backend is chosen per storage class. ``btrfs`` is real (a subvolume per volume with a qgroup limit on a btrfs
file system of the storage host). ``lustre``, ``vast`` and ``weka`` render the exact calls their systems would
receive (pure, deterministic: ``*_calls``) and ``send`` them; the drivers here *record* what they send (like the
network service's fabric drivers). A real appliance driver is a new class whose ``send`` talks to the appliance;
the renderers stay.

Every operation is idempotent per volume id (a redelivered command repeats it harmlessly) and raises
``BackendError`` with a reason an operator and a tenant can read when the storage system refuses (file system
full, quota cannot be set, appliance unreachable); anything else is a transient error the caller retries.
"""
from __future__ import annotations

import abc
import uuid
from dataclasses import dataclass, field
from typing import ClassVar


class BackendError(Exception):
    """The storage system refused or failed; str(exc) says why (the step's failure reason)."""


@dataclass(frozen=True)
class VolumeSpec:
    """A volume as the backend makes it: whose, how big, who may mount it."""

    volume_id: uuid.UUID
    tenant_id: uuid.UUID
    name: str                    # the tenant's name for it: [a-z0-9][a-z0-9-]{0,62}, no path separators
    size_bytes: int              # the hard limit (quota) of the volume
    shared: bool = False         # read-many: several allocations may mount it


@dataclass(frozen=True)
class Export:
    """Where a volume is mounted from, for the node-agent that mounts it into a slot."""

    volume_id: uuid.UUID
    backend: str
    source: str                  # btrfs: the subvolume's path on the storage host; lustre: "mgs@o2ib:/fs" (the
                                 # nodemap fileset picks the folder); vast, weka: "host:/path" (NFS)
    options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    used_bytes: int
    limit_bytes: int


@dataclass(frozen=True)
class BackendCall:
    """One request to a storage system: a REST call (method, absolute URL, JSON body) or a command line
    (method "exec", url = the command line, body None)."""

    method: str
    url: str
    body: dict | None = None


class StorageBackend(abc.ABC):
    """Makes, grows, exports and destroys tenant volumes on one storage system."""

    name: ClassVar[str]

    @abc.abstractmethod
    async def create(self, spec: VolumeSpec) -> Export:
        """Make the volume with its limit (idempotent: an existing one of the same id keeps its data; its limit is
        set again, never lowered below a resize)."""

    @abc.abstractmethod
    async def resize(self, volume_id: uuid.UUID, size_bytes: int) -> None:
        """Grow the volume's limit; BackendError when ``size_bytes`` is below the current limit."""

    @abc.abstractmethod
    async def delete(self, volume_id: uuid.UUID) -> None:
        """Destroy the volume and its data (idempotent: an unknown volume is nothing to do)."""

    @abc.abstractmethod
    async def usage(self, volume_id: uuid.UUID) -> Usage:
        """What the volume uses, as the storage system counts it, and its limit."""

    @abc.abstractmethod
    async def allow(self, volume_id: uuid.UUID, clients: tuple[str, ...], read_only: bool) -> None:
        """Let exactly ``clients`` (the tenant's slots' addresses) mount the volume, read-only or not."""

    @abc.abstractmethod
    async def revoke(self, volume_id: uuid.UUID, clients: tuple[str, ...]) -> None:
        """Take ``clients`` off the volume's access list (idempotent)."""

    def remember(self, spec: VolumeSpec) -> None:
        """Be told of a volume made earlier (the storage service says so before each call on an existing volume):
        a backend that keeps what it made only in memory (the recording drivers) knows it again after a restart,
        its size ``spec.size_bytes``. Sends nothing; a backend that finds its volumes on the storage system itself
        (btrfs) ignores it."""
