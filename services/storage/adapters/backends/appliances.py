"""What the appliance drivers (``lustre``, ``vast``, ``weka``) share: the recording ``send`` and a base class
whose subclasses only render.

A subclass of ``RenderingBackend`` writes pure renderers (``create_calls``, ``resize_calls``, ``delete_calls``,
``allow_calls``, ``revoke_calls``, ``usage_calls`` and ``export``): deterministic functions of their arguments,
no I/O, raising ``BackendError`` for invalid input (a shrink, a client that is not an IPv4 address). The base
class keeps what the drivers need between calls (each volume's spec, whose ``size_bytes`` is its current limit,
and its access list: client address → read-only) and implements the interface on top of the renderers:

* ``create`` of a known volume id sends nothing and returns the same ``Export``; ``delete`` of an unknown one
  sends nothing; ``delete`` first takes every client it let in off the volume, then destroys it; ``revoke`` of
  an unknown volume or client sends nothing; a ``resize`` to the current limit sends nothing.
* ``allow`` adds ``clients`` to the volume's access list with the given mode (a client already there in the
  other mode is moved); clients not named keep their access until ``revoke``. Each client is one exact host
  entry (its address, a /32): a list is never widened to a subnet or a wildcard.
* ``send`` delivers the calls. Here it *records* them: it appends ``(action, call)`` to the ``CallLog`` the
  driver was given. The state changes only after ``send`` returns, so a real ``send`` that raises leaves the
  volume as it was and a redelivered command renders the same calls again (a real ``send`` treats the
  appliance's "already exists" / "not found" answers to those as done).
* ``usage`` renders and sends the query a real driver would read usage from, and returns the recorded limit
  with ``used_bytes`` 0: a recording driver has no appliance to ask what the volume uses.

Objects the appliance numbers itself (VAST ids, WEKA uids) cannot be written literally into a call that
addresses one made earlier. A renderer writes a reference instead (``ref``): ``{field=value}`` as a URL path
segment stands for the id of the one object of the collection the URL names up to that segment whose
``field`` equals ``value``; ``{collection/field=value}`` as a whole JSON string value names the collection
from the API root. A real ``send`` resolves each reference with a GET of that collection just before the
call; the recording ``send`` records the calls as rendered. Nothing else in a rendered call is left open.
"""
from __future__ import annotations

import abc
import ipaddress
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .base import BackendCall, BackendError, Export, StorageBackend, Usage, VolumeSpec

Access = Mapping[str, bool]
"""A volume's access list: client address → read-only."""
NO_ACCESS: Access = MappingProxyType({})

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
NOBODY = 65534          # the id NFS servers and Lustre nodemaps squash unknown identities to


class CallLog:
    """Every call the recording drivers sent, in order, with the action that sent it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, BackendCall]] = []

    def of(self, action: str) -> list[BackendCall]:
        """The calls ``action`` sent ("create", "resize", "delete", "allow", "revoke", "usage")."""
        return [call for act, call in self.calls if act == action]


def volume_name(spec: VolumeSpec) -> str:
    """``t-<tenant8>-v-<volume8>``: the first 8 hex digits of the tenant's and of the volume's id."""
    return f"t-{spec.tenant_id.hex[:8]}-v-{spec.volume_id.hex[:8]}"


def ref(field_: str, value: str, collection: str = "") -> str:
    """A reference to an object the appliance numbers (see the module's docstring)."""
    return "{" + (f"{collection}/" if collection else "") + f"{field_}={value}" + "}"


def check_spec(spec: VolumeSpec) -> None:
    if spec.size_bytes <= 0:
        raise BackendError(f"volume {spec.volume_id}: its size must be positive, not {spec.size_bytes} bytes")
    if not NAME.fullmatch(spec.name):
        raise BackendError(f"volume {spec.volume_id}: {spec.name!r} is not a volume name ([a-z0-9][a-z0-9-]{{0,62}})")


def check_grow(spec: VolumeSpec, size_bytes: int) -> bool:
    """Whether resizing ``spec`` to ``size_bytes`` changes anything; BackendError for a shrink."""
    if size_bytes < spec.size_bytes:
        raise BackendError(f"volume {spec.volume_id} cannot shrink from {spec.size_bytes} to {size_bytes} bytes; "
                           "a volume only grows")
    return size_bytes > spec.size_bytes


def clients_of(clients: Iterable[str]) -> tuple[str, ...]:
    """The clients as exact IPv4 host addresses, each once, in the order given; BackendError for anything else
    (a subnet, a range, a wildcard, a name): an access list holds exactly the tenant's slots."""
    seen: dict[str, None] = {}
    for client in clients:
        try:
            seen[str(ipaddress.IPv4Address(client))] = None
        except (ipaddress.AddressValueError, ValueError):
            raise BackendError(f"client {client!r} is not an IPv4 address; a volume is opened to single "
                               "slot addresses only") from None
    return tuple(seen)


def changed(clients: Iterable[str], read_only: bool, access: Access) -> list[str]:
    """The clients whose access ``allow`` changes: not yet on the list, or there in the other mode."""
    return [c for c in clients_of(clients) if access.get(c) is not read_only]


def granted(access: Access, read_only: bool) -> list[str]:
    """The clients ``access`` lets in with that mode, in address order."""
    return sorted((c for c, ro in access.items() if ro is read_only), key=ipaddress.IPv4Address)


@dataclass
class Recorded:
    """What a driver knows of one of its volumes."""

    spec: VolumeSpec                                    # size_bytes: the current limit
    access: dict[str, bool] = field(default_factory=dict)


class RenderingBackend(StorageBackend):
    """A storage backend made of pure renderers and a ``send`` (here: recording into a ``CallLog``)."""

    def __init__(self, log: CallLog | None = None):
        self.log = log if log is not None else CallLog()
        self.volumes: dict[uuid.UUID, Recorded] = {}

    # -- renderers (pure) ---------------------------------------------------------------------------------------
    @abc.abstractmethod
    def create_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        """The calls that make the volume with its limit, open to no client yet."""

    @abc.abstractmethod
    def resize_calls(self, spec: VolumeSpec, size_bytes: int) -> list[BackendCall]:
        """The calls that raise the limit of ``spec`` (its current one) to ``size_bytes``; none when equal."""

    @abc.abstractmethod
    def delete_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        """The calls that destroy the volume and its data (its clients already revoked)."""

    @abc.abstractmethod
    def allow_calls(self, spec: VolumeSpec, clients: Iterable[str], read_only: bool,
                    access: Access = NO_ACCESS) -> list[BackendCall]:
        """The calls that let ``clients`` mount the volume in that mode, given its access list before."""

    @abc.abstractmethod
    def revoke_calls(self, spec: VolumeSpec, clients: Iterable[str], access: Access = NO_ACCESS) -> list[BackendCall]:
        """The calls that take ``clients`` off the volume's access list ``access``."""

    @abc.abstractmethod
    def usage_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        """The query a real driver reads the volume's usage and limit from."""

    @abc.abstractmethod
    def export(self, spec: VolumeSpec) -> Export:
        """Where a node mounts the volume from; ``options["fstype"]`` is the mount type, every other key a
        mount option (value "" for a flag)."""

    def refuse_create(self, spec: VolumeSpec) -> None:
        """BackendError when ``spec`` clashes with another live volume of this driver. Here: two volumes with one
        name (the first 8 hex digits of both their ids alike)."""
        name = volume_name(spec)
        for other in self.volumes.values():
            if volume_name(other.spec) == name:
                raise BackendError(f"volume {spec.volume_id} would be named {name} on {self.name} like volume "
                                   f"{other.spec.volume_id}; create it under another id")

    def refuse_allow(self, spec: VolumeSpec, clients: tuple[str, ...]) -> None:
        """BackendError when letting ``clients`` into ``spec`` clashes with another volume (none here)."""

    # -- delivery -----------------------------------------------------------------------------------------------
    async def send(self, action: str, calls: list[BackendCall]) -> None:
        """Deliver ``calls``: the recording drivers append them to the call log."""
        self.log.calls.extend((action, call) for call in calls)

    # -- the interface ------------------------------------------------------------------------------------------
    def remember(self, spec: VolumeSpec) -> None:
        """Know ``spec`` again (after a restart: this driver keeps its volumes in memory only); its access list
        starts empty. A volume known already is left as it is."""
        self.volumes.setdefault(spec.volume_id, Recorded(spec))

    def _known(self, volume_id: uuid.UUID) -> Recorded:
        if (rec := self.volumes.get(volume_id)) is None:
            raise BackendError(f"{self.name} has no volume {volume_id}")
        return rec

    async def create(self, spec: VolumeSpec) -> Export:
        if (rec := self.volumes.get(spec.volume_id)) is not None:
            return self.export(rec.spec)
        check_spec(spec)
        self.refuse_create(spec)
        await self.send("create", self.create_calls(spec))
        self.volumes[spec.volume_id] = Recorded(spec)
        return self.export(spec)

    async def resize(self, volume_id: uuid.UUID, size_bytes: int) -> None:
        rec = self._known(volume_id)
        calls = self.resize_calls(rec.spec, size_bytes)
        await self.send("resize", calls)
        rec.spec = VolumeSpec(rec.spec.volume_id, rec.spec.tenant_id, rec.spec.name, size_bytes, rec.spec.shared)

    async def delete(self, volume_id: uuid.UUID) -> None:
        if (rec := self.volumes.get(volume_id)) is None:
            return
        calls = self.revoke_calls(rec.spec, tuple(rec.access), rec.access) + self.delete_calls(rec.spec)
        await self.send("delete", calls)
        del self.volumes[volume_id]

    async def usage(self, volume_id: uuid.UUID) -> Usage:
        """The recorded limit and 0 used: a recording driver cannot know what the volume uses (it sends the
        query a real driver would read, and has no appliance to answer it)."""
        rec = self._known(volume_id)
        await self.send("usage", self.usage_calls(rec.spec))
        return Usage(used_bytes=0, limit_bytes=rec.spec.size_bytes)

    async def allow(self, volume_id: uuid.UUID, clients: tuple[str, ...], read_only: bool) -> None:
        rec = self._known(volume_id)
        clients = clients_of(clients)
        self.refuse_allow(rec.spec, clients)
        await self.send("allow", self.allow_calls(rec.spec, clients, read_only, rec.access))
        rec.access.update(dict.fromkeys(clients, read_only))

    async def revoke(self, volume_id: uuid.UUID, clients: tuple[str, ...]) -> None:
        if (rec := self.volumes.get(volume_id)) is None:
            return
        clients = clients_of(clients)
        await self.send("revoke", self.revoke_calls(rec.spec, clients, rec.access))
        for client in clients:
            rec.access.pop(client, None)
