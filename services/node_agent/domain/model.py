"""What the node-agent provisions and what runs on its node. Pure: no I/O."""
from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from .vm.domain_xml import SlotDevices
from .volumes import Volume


@dataclass(frozen=True)
class KeptInstance:
    """An instance as the node keeps it: the allocation's instance, and the provision command it was made from
    (JSON, as it arrived; None for an instance recorded before commands were kept), so a reconcile can make it
    again."""

    allocation_id: uuid.UUID
    instance_id: str
    slots: tuple[int, ...]
    command: str | None = None


@dataclass(frozen=True)
class Check:
    """One burn-in check's outcome: ``detail`` says what it found."""

    name: str
    ok: bool
    detail: str = ""


class InvalidRequest(ValueError):
    """A provisioning request that can never be carried out as given (e.g. no slots)."""


@dataclass(frozen=True)
class BootImage:
    """The image an instance boots (the catalog's snapshot): a disk, and optionally a kernel and initramfs."""

    name: str
    format: str
    source: str
    sha256: str
    min_disk_gb: int = 1
    kernel: str | None = None
    initrd: str | None = None
    kernel_args: str | None = None


@dataclass(frozen=True)
class GuestConfig:
    """What the guest is told at first boot."""

    image: BootImage
    hostname: str
    ssh_keys: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()


@dataclass(frozen=True)
class NicConfig:
    """The instance's interface on its tenant network: the port (tap) name the dataplane plugs, its addresses."""

    port: str
    mac: str
    ip_address: str
    prefix_len: int
    gateway: str | None
    mtu: int | None = None   # the tenant network's MTU on this node (None: the guest's default)

    @property
    def interface(self) -> str:
        """Its address with the prefix ("10.0.0.5/24"), as an instance reports it."""
        return f"{self.ip_address}/{self.prefix_len}"


@dataclass(frozen=True)
class InstanceSpec:
    """What to run on the node for one allocation."""

    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    node_id: uuid.UUID
    slots: tuple[int, ...]
    volume_id: uuid.UUID | None = None
    ip_address: str | None = None
    mac_address: str | None = None
    resources: tuple[SlotDevices, ...] = ()   # the reserved slots' devices, from the approved slot map
    guest: GuestConfig | None = None
    nic: NicConfig | None = None
    volumes: tuple[Volume, ...] = ()          # mounted at /mnt/<name> in every slot (checked: distinct)


@dataclass(frozen=True)
class Instance:
    """An allocation's instance as a driver reports it (at most one per allocation and node)."""

    allocation_id: uuid.UUID
    instance_id: str
    slots: tuple[int, ...]


def checked_slots(slots: Iterable[int]) -> tuple[int, ...]:
    """The slots in ascending order; raises InvalidRequest when empty, negative or repeated."""
    ordered = tuple(sorted(slots))
    if not ordered:
        raise InvalidRequest("no slots given: an instance needs at least one slot")
    if ordered[0] < 0:
        raise InvalidRequest(f"slot numbers are never negative: {list(ordered)}")
    if len(set(ordered)) != len(ordered):
        raise InvalidRequest(f"a slot is given twice: {list(ordered)}")
    return ordered
