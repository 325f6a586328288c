"""The node-agent's ports in memory, for unit tests of its handlers (no I/O): its records, a wiper and a burn-in
that do as told, and a node built over them with the sim driver.

FakeNodeRecords   one node's records over dicts; ``locks`` lists the allocations locked, in order
FakeWiper         every slot's wipe succeeds (simulated evidence) except the slots named to fail
FakeBurnIn        every check passes except those named to fail
sim_node(...)     a Node over the fakes and a SimDriver (its volumes' state under ``state_dir``)
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

from services.network.contracts import SlotAttachment, TenantNetworks
from services.node_agent.adapters.drivers import ProvisioningDriver, SimDriver
from services.node_agent.adapters.drivers.namespaces import MountNamespaces
from services.node_agent.adapters.drivers.volumes import VolumeConfig
from services.node_agent.contracts import Bmc, ProvisionNode, SetBmc, SlotWipe
from services.node_agent.domain.model import Check, Instance, KeptInstance
from services.node_agent.domain.ports import BurnIn, NodeRecords, SlotWiper
from services.node_agent.domain.wipe import DeviceEvidence, SlotEvidence
from services.node_agent.handlers import Node
from tests.support.fakes import factory


class FakeNodeRecords(NodeRecords):
    def __init__(self) -> None:
        self.kept: dict[uuid.UUID, KeptInstance] = {}
        self.tenants: dict[uuid.UUID, TenantNetworks] = {}
        self.attachments: dict[uuid.UUID, tuple[uuid.UUID, SlotAttachment]] = {}
        self.wipes: list[tuple[SlotWipe, uuid.UUID | None, uuid.UUID | None]] = []   # (evidence, allocation, request)
        self.bmc_kept: SetBmc | None = None
        self.locks: list[uuid.UUID] = []
        self.busy: set[uuid.UUID] = set()   # allocations another unit of work holds

    async def lock_allocation(self, allocation_id: uuid.UUID) -> None:
        self.locks.append(allocation_id)

    async def try_lock_allocation(self, allocation_id: uuid.UUID) -> bool:
        return allocation_id not in self.busy

    async def record_instance(self, instance: Instance, command: ProvisionNode | None = None) -> None:
        self.kept[instance.allocation_id] = KeptInstance(instance.allocation_id, instance.instance_id, instance.slots,
                                                         command.model_dump_json() if command else None)

    async def keep_command(self, command: ProvisionNode) -> None:
        was = self.kept.get(command.allocation_id)
        if was is not None:
            self.kept[command.allocation_id] = KeptInstance(was.allocation_id, was.instance_id, was.slots,
                                                            command.model_dump_json())

    async def command_of(self, allocation_id: uuid.UUID) -> str | None:
        kept = self.kept.get(allocation_id)
        return kept.command if kept else None

    async def instance(self, allocation_id: uuid.UUID) -> KeptInstance | None:
        return self.kept.get(allocation_id)

    async def instances(self) -> dict[uuid.UUID, KeptInstance]:
        return dict(self.kept)

    async def forget_instance(self, allocation_id: uuid.UUID) -> str | None:
        gone = self.kept.pop(allocation_id, None)
        return gone.instance_id if gone else None

    async def keep_tenant(self, tenant: TenantNetworks) -> TenantNetworks:
        kept = self.tenants.get(tenant.tenant_id)
        if kept is None or kept.version < tenant.version:
            self.tenants[tenant.tenant_id] = kept = tenant
        return kept

    async def record_attachment(self, tenant_id: uuid.UUID, attachment: SlotAttachment) -> None:
        self.attachments[attachment.allocation_id] = (tenant_id, attachment)

    async def forget_attachment(self, allocation_id: uuid.UUID) -> bool:
        return self.attachments.pop(allocation_id, None) is not None

    async def desired_network(self) -> tuple[list[TenantNetworks], list[tuple[uuid.UUID, SlotAttachment]]]:
        return list(self.tenants.values()), list(self.attachments.values())

    async def record_wipes(self, evidence: list[SlotWipe], *, allocation_id: uuid.UUID | None = None,
                           request_id: uuid.UUID | None = None) -> None:
        self.wipes += [(e, allocation_id, request_id) for e in evidence]

    async def keep_bmc(self, cmd: SetBmc) -> bool:
        if self.bmc_kept is not None and self.bmc_kept.version >= cmd.version:
            return False
        self.bmc_kept = cmd
        return True

    async def bmc(self) -> Bmc | None:
        return self.bmc_kept.bmc if self.bmc_kept else None


class FakeWiper(SlotWiper):
    """Wipes nothing; ``calls`` lists (slot, policy) as asked."""

    def __init__(self, *failing: int):
        self.failing = set(failing)
        self.calls: list[tuple[int, str]] = []

    async def wipe_slot(self, slot: int, *, nvme_pci: str | None, gpu_pci: str | None, policy: str) -> SlotEvidence:
        self.calls.append((slot, policy))
        ok = slot not in self.failing
        now = datetime.now(UTC)
        device = DeviceEvidence(device="simulated", method="simulated", bytes=0, duration_s=0.0, verified=ok,
                                verification="simulated", ok=ok, reason=None if ok else "injected", commands=())
        return SlotEvidence(slot=slot, devices=(device,), gpu_reset="simulated", ok=ok,
                            reason=None if ok else "injected", policy=policy, started_at=now, finished_at=now,
                            duration_s=0.0, agent_version="test")


class FakeBurnIn(BurnIn):
    name = "fake"

    def __init__(self, *failing: str):
        self.failing = set(failing)

    def run(self) -> list[Check]:
        return [Check(n, n not in self.failing, "failed" if n in self.failing else "ok")
                for n in ("gpus_present", "temperature")]


def sim_node(state_dir: Path, *, driver: ProvisioningDriver | None = None, records: FakeNodeRecords | None = None,
             wiper: SlotWiper | None = None, burn_in: BurnIn | None = None, secret_key: bytes | None = None) -> Node:
    """A node (no dataplane) over the fakes and ``driver`` (default: a SimDriver keeping its volumes under
    ``state_dir``)."""
    driver = driver or SimDriver(volumes=MountNamespaces(VolumeConfig((), state_dir)))
    node = Node(id=uuid.uuid4(), driver=driver, records=factory(records or FakeNodeRecords()),
                wiper=wiper or FakeWiper(), burn_in=burn_in or FakeBurnIn(), secret_key=secret_key)
    node.loaded.set()
    return node
