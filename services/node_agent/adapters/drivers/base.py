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
from typing import Mapping

from ...domain.model import Instance, InstanceSpec


class DriverError(Exception):
    """The driver could not carry out the operation; str(exc) says why, for the operator and the saga."""


class DriverConfigError(ValueError):
    """The driver's configuration (environment) is invalid; raised at start, before anything connects."""


class ProvisioningDriver(abc.ABC):
    """Creates and removes one instance per allocation on this node."""

    name: str = "abstract"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "ProvisioningDriver":
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
        """

    @abc.abstractmethod
    async def deprovision(self, allocation_id: uuid.UUID) -> None:
        """Make sure nothing of the allocation is left on the node.

        Idempotent, and safe when the allocation was never provisioned. May block.
        Raises DriverError when it cannot remove the instance (the instance stays).
        """

    @abc.abstractmethod
    async def list_instances(self) -> list[Instance]:
        """Every instance on the node, one per allocation, in no particular order. Raises DriverError."""
