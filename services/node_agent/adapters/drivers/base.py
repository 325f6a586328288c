"""The one interface every provisioning driver implements (sim, libvirt, redfish ...).

A driver acts on the node it runs on; the node-agent calls it from inside a
message handler, so every method may be retried after a crash or redelivery and
must therefore be idempotent. Drivers raise ``DriverError`` for an operation
that failed (the message becomes the step's failure reason); any other exception
is treated as transient by the caller (the command is retried, then
dead-lettered).
"""
from __future__ import annotations

import abc
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from ...domain.model import Instance, InstanceSpec
from ...domain.volumes import MountedVolume, Volume
from .redfish.bmc import BmcConfig


class DriverError(Exception):
    """The driver could not carry out the operation; str(exc) says why, for the operator and the saga."""


class DriverConfigError(ValueError):
    """The driver's configuration (environment) is invalid; raised at start, before anything connects."""


PowerAction = Literal["reboot", "stop", "start"]
# what the node offers its driver (``ProvisioningDriver.bind``): the callback it wants once an instance started,
# and where the BMC registered for the node is (its password unsealed; None when none is registered)
InstanceStarted = Callable[[uuid.UUID], Awaitable[None]]
BmcSource = Callable[[], Awaitable[BmcConfig | None]]


@dataclass(frozen=True)
class Console:
    """A piece of an instance's serial console log: ``text`` starts at byte ``offset``; read on from ``next_offset``."""

    offset: int
    next_offset: int
    text: str
    running: bool


class ProvisioningDriver(abc.ABC):
    """Creates and removes one instance per allocation on this node."""

    name: str = "abstract"
    # True: instances outlive the agent (a hypervisor keeps them), so the node reconciles them against its
    # records; False (sim): a restarted agent starts empty by design
    persistent: bool = False
    # True: an instance's network port is a tap its hypervisor makes (the dataplane plugs it, no veth stand-in)
    guest_ports: bool = False
    # True: the slots' devices are not on this host (sim; a VM host with passthrough off): with no disks named
    # in TESSERA_WIPE_DEVICES, the wipe on release is simulated, and its evidence says so
    devices_simulated: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ProvisioningDriver:
        """Build the driver from its TESSERA_* variables; raises DriverConfigError. Connects to nothing."""
        return cls()

    @abc.abstractmethod
    async def provision(self, spec: InstanceSpec) -> str:
        """Make sure an instance for ``spec.allocation_id`` exists and return its instance id.

        Idempotent per allocation: provisioning an allocation that already has an
        instance returns that instance's id and creates nothing (the first spec
        wins), also when two calls race. May block for as long as provisioning
        takes (seconds to minutes). Raises DriverError on failure, leaving no
        instance of the allocation behind.

        ``spec.volumes`` appear in every slot at /mnt/<name> (or are refused:
        DriverError); ``instance_info``'s "mounts" lists them.
        """

    @abc.abstractmethod
    async def deprovision(self, allocation_id: uuid.UUID) -> None:
        """Make sure nothing of the allocation is left on the node.

        Idempotent, and safe when the allocation was never provisioned. May block.
        Its volumes are unmounted too, also when a crash left them without an instance.
        Raises DriverError when it cannot remove the instance (the instance stays).
        """

    @abc.abstractmethod
    async def list_instances(self) -> list[Instance]:
        """Every instance on the node, one per allocation, in no particular order. Raises DriverError."""

    async def instance_of(self, allocation_id: uuid.UUID) -> Instance | None:
        """The allocation's instance on the node, or None; drivers that can look one up override the listing."""
        return next((i for i in await self.list_instances() if i.allocation_id == allocation_id), None)

    async def instance_info(self, allocation_id: uuid.UUID) -> dict:
        """What the tenant sees of the instance besides its id (contracts.InstanceInfo's fields: passthrough,
        booted_at, boot_s, image, hostname, power_state). Raises DriverError."""
        return {"passthrough": "none"}

    async def power(self, allocation_id: uuid.UUID, action: PowerAction) -> str:
        """Carry out a power action and return the power state after it ("running" or "stopped"). Idempotent
        (start of a running instance, stop of a stopped one: nothing to do). Raises DriverError, also when the
        allocation has no instance here."""
        raise DriverError(f"the {self.name} driver has no power actions")

    async def console(self, allocation_id: uuid.UUID, offset: int, limit: int) -> Console | None:
        """Up to ``limit`` bytes of the serial console from ``offset`` (-1: the last ``limit`` bytes); None when
        the allocation has no instance (or no console) here."""
        return None

    async def mount(self, allocation_id: uuid.UUID, volume: Volume) -> MountedVolume:
        """Mount ``volume`` into the allocation's running instance at /mnt/<name> (a live attach). Idempotent per
        volume id: a mounted volume is reported as it is. Raises DriverError: no instance here, the volume is
        refused, or the mount failed (nothing of it is left then)."""
        raise DriverError(f"the {self.name} driver cannot mount volumes into a running instance")

    async def unmount(self, allocation_id: uuid.UUID, volume_id: uuid.UUID) -> bool:
        """Unmount the volume from the allocation's instance (a live detach); True when it was mounted. Idempotent.
        Raises DriverError when it cannot (the volume stays mounted)."""
        raise DriverError(f"the {self.name} driver cannot unmount volumes from a running instance")

    def bind(self, node_id: uuid.UUID, topology: Callable[[], dict], *, instance_started: InstanceStarted | None = None,
             bmc: BmcSource | None = None) -> None:
        """Tell the driver what the node offers it; the bootstrap calls it once, before anything runs. Each driver
        keeps what it uses and ignores the rest (the sim driver: all of it).

        ``node_id``: the node it serves; ``topology``: how to read the node's topology (a blocking call);
        ``instance_started``: to call with the allocation id once the hypervisor started an instance, before the
        driver waits for the guest (the node plugs the instance's network port: a tap exists only once its
        instance runs); ``bmc``: the BMC registered for the node (bare metal)."""

    async def close(self) -> None:
        """At stop: release what the driver holds (the redfish driver's media server). Nothing, by default."""
