"""The node-agent's ports: what its handlers need from its own schema and from the node's hardware, stated
without any (pure, no I/O).

``NodeRecords`` is the node's records in the node_agent schema; ``adapters.records.PgNodeRecords`` implements it
on a unit of work's connection, the unit tests use an in-memory fake (tests/support/node_agent.py). Nothing here
commits: every change belongs to the caller's unit of work. ``SlotWiper`` and ``BurnIn`` are the node's hardware
lifecycle (``adapters.wipe``, ``adapters.burn_in``). The provisioning driver is the third port of the node; it
lives with its implementations (``adapters.drivers.base``).
"""
from __future__ import annotations

import abc
import uuid

from services.network.contracts import SlotAttachment, TenantNetworks

from ..contracts import Bmc, ProvisionNode, SetBmc, SlotWipe
from .model import Check, Instance, KeptInstance
from .wipe import SlotEvidence


class NodeRecords(abc.ABC):
    """One node's records: its instances (with the command each was made from), its desired network inputs, its
    wipes and its BMC."""

    # -- instances ----------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def lock_allocation(self, allocation_id: uuid.UUID) -> None:
        """Serialise every command for the allocation on this node until the unit of work ends (may wait).

        Without it a compensation could run while the provision it compensates is still inside the driver: the
        late provision would then overwrite the tombstone and leave an instance nobody will remove."""

    @abc.abstractmethod
    async def try_lock_allocation(self, allocation_id: uuid.UUID) -> bool:
        """``lock_allocation`` without waiting: False when a command for the allocation is being handled."""

    @abc.abstractmethod
    async def record_instance(self, instance: Instance, command: ProvisionNode | None = None) -> None:
        """Insert or refresh the allocation's instance (idempotent); ``command``: the provision command, kept so a
        reconcile can make the instance again when it vanished."""

    @abc.abstractmethod
    async def keep_command(self, command: ProvisionNode) -> None:
        """Replace the provision command kept with its allocation's instance (its volumes changed while it runs)."""

    @abc.abstractmethod
    async def command_of(self, allocation_id: uuid.UUID) -> str | None:
        """The provision command (JSON) the allocation's instance here was made from; None without an instance (or
        one recorded before commands were kept)."""

    @abc.abstractmethod
    async def instance(self, allocation_id: uuid.UUID) -> KeptInstance | None:
        """The allocation's instance here, or None."""

    @abc.abstractmethod
    async def instances(self) -> dict[uuid.UUID, KeptInstance]:
        """Every instance kept for the node, by allocation."""

    @abc.abstractmethod
    async def forget_instance(self, allocation_id: uuid.UUID) -> str | None:
        """Forget the allocation's instance; the instance id it had, or None when there was none."""

    # -- the desired network ------------------------------------------------------------------------------
    @abc.abstractmethod
    async def keep_tenant(self, tenant: TenantNetworks) -> TenantNetworks:
        """Keep the tenant's snapshot unless a newer one is kept; returns the newest kept (idempotent)."""

    @abc.abstractmethod
    async def record_attachment(self, tenant_id: uuid.UUID, attachment: SlotAttachment) -> None:
        """Keep the slot's attachment (one per allocation; a repeat replaces it)."""

    @abc.abstractmethod
    async def forget_attachment(self, allocation_id: uuid.UUID) -> bool:
        """Forget the allocation's attachment; True when there was one."""

    @abc.abstractmethod
    async def desired_network(self) -> tuple[list[TenantNetworks], list[tuple[uuid.UUID, SlotAttachment]]]:
        """Everything the node should plumb: the tenant snapshots and the (tenant_id, attachment) pairs."""

    # -- hardware -----------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def record_wipes(self, evidence: list[SlotWipe], *, allocation_id: uuid.UUID | None = None,
                           request_id: uuid.UUID | None = None) -> None:
        """Keep each slot's wipe evidence, for the release of ``allocation_id`` or the re-wipe ``request_id``."""

    @abc.abstractmethod
    async def keep_bmc(self, cmd: SetBmc) -> bool:
        """Keep the node's BMC unless a newer version is kept; True when this version is now the node's."""

    @abc.abstractmethod
    async def bmc(self) -> Bmc | None:
        """The BMC registered for the node (its password sealed), or None."""


class SlotWiper(abc.ABC):
    """Erases what a tenant left in a slot (its disks, its GPU's memory) and says how."""

    @abc.abstractmethod
    async def wipe_slot(self, slot: int, *, nvme_pci: str | None, gpu_pci: str | None, policy: str) -> SlotEvidence:
        """Erase, verify and reset ``slot`` under ``policy``; the evidence says whether it worked. Never raises for
        a wipe that fails (nor for an unknown policy): that is an outcome."""


class BurnIn(abc.ABC):
    """The checks a node passes before it becomes schedulable; ``name`` names the implementation in reports."""

    name: str

    @abc.abstractmethod
    def run(self) -> list[Check]:
        """Run every check (blocking: the caller runs it in a thread); a failed check is an outcome, not an error."""
