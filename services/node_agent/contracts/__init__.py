"""Wire contract of the node-agent (one process per node; subjects carry the node id)."""
# the hardware lifecycle models (BMC, wipe, burn-in) live in contracts/hardware.py, the fence of a moved
# allocation's old node in contracts/fencing.py; both are re-exported here

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from services.network.contracts import SlotAttachment, SwitchPort, TenantNetworks
from services.scheduler.contracts import SlotDetail
from services.storage.contracts import Mode, VolumeExport
from shared.contract import Message, ServiceContract
from shared.steps import Step
from shared.wire import StepCommand, StepFailure, StepReply, StepUndone, UndoCommand, Wire

from .fencing import FENCE_NODE, FenceNode, NodeFenced, NodeFenceFailed
from .hardware import (
    Bmc,
    BmcReport,
    BurnInCheck,
    BurnInFinished,
    DeviceWipe,
    QuarantinedSlot,
    Rewipe,
    RunBurnIn,
    SetBmc,
    SlotRewiped,
    SlotsWiped,
    SlotWipe,
    ValidateBmc,
    WipeSlots,
)
from .health import (
    Alert,
    Condition,
    FaultInjected,
    FaultKind,
    FenceInstances,
    GpuMetrics,
    Heartbeat,
    InjectFault,
    InstancesFenced,
)

Sha256 = Field(pattern=r"^[0-9a-f]{64}$", description="Lower-case hex SHA-256.", examples=["0" * 64])
PowerAction = Literal["reboot", "stop", "start"]
PowerState = Literal["running", "stopped", "unknown"]
HcaGuid = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-f]{16}$")]
NetworkPhase = Literal["provisioning", "tenant", "cleaning"]


class ImageRef(Wire):
    """The image an instance boots, as the catalog held it when the allocation was requested (a snapshot:
    a later change to the catalog does not change a running or provisioning instance)."""

    image_id: uuid.UUID
    name: str = Field(max_length=63)
    os: str = Field(max_length=63)
    format: Literal["qcow2", "raw"]
    source: str = Field(max_length=1024, description="Absolute path or http(s) URL the nodes can read.")
    sha256: str = Sha256
    min_disk_gb: int = Field(default=1, ge=1, le=65536)
    kernel: str | None = Field(default=None, max_length=1024, description="Direct kernel boot: the kernel's path or URL.")
    initrd: str | None = Field(default=None, max_length=1024, description="Direct kernel boot: the initramfs.")
    kernel_args: str | None = Field(default=None, max_length=1024)


class Guest(Wire):
    """What the guest is told at first boot (cloud-init NoCloud seed)."""

    image: ImageRef
    hostname: str = Field(max_length=63)
    ssh_keys: list[str] = Field(default_factory=list, max_length=32)
    dns: list[str] = Field(default_factory=list, max_length=4)


class ProvisionNode(StepCommand):
    node_id: uuid.UUID
    slots: list[int]
    volume_id: uuid.UUID | None = None
    ip_address: str | None = None
    mac_address: str | None = None
    attachment: SlotAttachment | None = Field(default=None, description="The allocation's interface to plumb on the node.")
    tenant_networks: TenantNetworks | None = Field(default=None, description="The tenant's networks and rules (with attachment).")
    slot_details: list[SlotDetail] = Field(default_factory=list, description="The reserved slots' devices (from the slot map).")
    guest: Guest | None = Field(default=None, description="The image and first-boot data (absent: the driver's default).")
    volumes: list[VolumeExport] = Field(default_factory=list, max_length=16,
                                        description="Volumes to mount into the slots, each at /mnt/<name>.")


class Phase(Wire):
    """One provisioning phase of a bare-metal instance and how long it took."""

    name: str = Field(max_length=63)
    seconds: float = Field(ge=0)


class InstanceInfo(Wire):
    """An instance as the tenant sees it on the allocation (the gateway's API shows it as described here)."""

    instance_id: str = Field(description="The driver's name for it (libvirt: the domain name).")
    driver: str = Field(description="The driver that made it: sim, libvirt, ...")
    dataplane: str = Field(description="none (no network plumbed) or kernel.")
    node_id: uuid.UUID
    image: str | None = None
    hostname: str | None = None
    # simulated: the libvirt driver ran the domain without devices (TESSERA_LIBVIRT_PASSTHROUGH=off)
    passthrough: Literal["real", "simulated", "none"] = Field(
        description="real: the GPUs, NVMe and InfiniBand VF were passed through; simulated: the host lacks them "
                    "(no GPUs), the guest runs without; none: the driver has no devices.")
    booted_at: datetime | None = None
    prepare_s: float | None = Field(default=None, description="Seconds to verify the image and make the overlay and seed.")
    start_s: float | None = Field(default=None, description="Seconds the hypervisor took to define and start it.")
    boot_s: float | None = Field(default=None, description="Seconds from start to the guest's ready line.")
    power_state: PowerState = "running"
    phases: list[Phase] = Field(default_factory=list, description="Bare metal: each provisioning phase (power, "
                                "virtual media, boot, ...) and its duration, in order.")
    redfish_calls: int | None = Field(default=None, description="Bare metal: HTTP requests made to the node's BMC.")
    mounts: list[Mount] = Field(default_factory=list, description="The volumes mounted into the instance, each "
                                                                    "at /mnt/<name>.")
    addresses: list[Annotated[str, StringConstraints(max_length=49)]] = Field(
        default_factory=list, max_length=8, examples=[["10.8.0.5/24"]],
        description="The instance's addresses on its tenant network, address/prefix.")
    switch_port: SwitchPort | None = Field(default=None, description="Bare metal: the leaf switch and port the "
                                           "server's NIC is cabled to (its tenant network is moved there).")
    hca_guids: list[HcaGuid] = Field(default_factory=list, max_length=16, examples=[["0x0002c903000e0b72"]],
                                     description="Bare metal: the InfiniBand HCA port GUIDs of the server (added "
                                                 "to the tenant's partition at hand-off).")
    network_phase: NetworkPhase | None = Field(default=None, description="Bare metal: the network the server's "
                                               "port is on: provisioning (deploy), tenant (handed off), cleaning "
                                               "(released, being wiped).")


class Mount(Wire):
    """A volume mounted into the instance: where its slots see it and how."""

    volume_id: uuid.UUID
    name: str = Field(max_length=63)
    mount_point: str = Field(max_length=80, description="/mnt/<volume name>")
    mode: Mode
    via: Literal["virtiofs", "bind", "nfs", "lustre"] = Field(description="virtiofs (VM), bind (a slot's own mount "
                                                                        "namespace), or the backend's client "
                                                                        "(nfs, lustre).")
    tag: str | None = Field(default=None, max_length=36, description="virtiofs: the device's mount tag.")
    simulated: bool = Field(default=False, description="True: the backend's client mount was rendered, not run "
                                                       "(an appliance this machine cannot reach).")


InstanceInfo.model_rebuild()


class NodeProvisioned(StepReply):
    node_id: uuid.UUID
    instance_id: str
    instance: InstanceInfo | None = None


class NodeProvisionFailed(StepFailure):
    pass


class DeprovisionNode(UndoCommand):
    node_id: uuid.UUID


class NodeDeprovisioned(StepUndone):
    node_id: uuid.UUID


PROVISION_NODE = Step.declare(
    "node_agent", subject_params=("node_id",),
    command=("provision", ProvisionNode, "Saga step: provision the allocation on this node."),
    ok=("node_provisioned", NodeProvisioned, "The allocation runs on the node."),
    failed=("node_provision_failed", NodeProvisionFailed, "Provisioning failed on the node."),
    undo=("deprovision", DeprovisionNode, "Saga step or compensation: remove the allocation from this node (idempotent)."),
    undone=("node_deprovisioned", NodeDeprovisioned, "Nothing of the allocation is left on the node."),
)


WIPE_SLOTS = Step.declare(
    "node_agent", subject_params=("node_id",),
    command=("wipe_slots", WipeSlots, "Release step: wipe the slots' disks, reset their GPUs, record the evidence."),
    ok=("slots_wiped", SlotsWiped, "The wipe ran: evidence per slot; failed slots are to be quarantined."),
)


class NetworkRepaired(Wire):
    """One repair the node's reconcile made: the kernel had drifted from the desired state."""

    node_id: uuid.UUID
    action: Literal["create", "remove", "replace"]
    object: str = Field(description="'<kind>:<name>', e.g. 'vxlan:tvx0000c8' or 'slot:ts-1a2b3c4d-...'.")
    detail: str = ""


class PowerActionRef(Wire):
    """Which power action: its request, the allocation and tenant it is for, the node, the action, who asked."""

    request_id: uuid.UUID
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    node_id: uuid.UUID
    action: PowerAction
    requested_by: uuid.UUID


class RequestPower(PowerActionRef):
    """A tenant's power action on its instance (sent by the gateway, which checked the allocation is ACTIVE and
    the tenant's). Idempotent per request_id. Carried out only until ``expires_at``: a node that handles it
    later refuses it (power_changed, ok false), so a node back after hours never reboots a VM whose tenant
    gave up long ago. ``expires_at`` has no default: a command without one (sent before deadlines existed) fails
    validation and is dead-lettered, and the gateway's sweep fails its action (its migration gave the actions
    asked before then the default deadline)."""

    expires_at: datetime = Field(description="The deadline (with its UTC offset): the node refuses the command "
                                             "after it, without acting.")

    @field_validator("expires_at")
    @classmethod
    def _with_offset(cls, value: datetime) -> datetime:
        # a naive time could not be compared with the node's clock: refused as invalid, never retried
        if value.utcoffset() is None:
            raise ValueError("a deadline needs its UTC offset")
        return value


class PowerChanged(PowerActionRef):
    """The outcome of a power action (ok or not), and the instance's power state after it."""

    ok: bool
    power_state: PowerState
    reason: str | None = Field(default=None, max_length=2000)
    at: datetime


class InstanceProblem(Wire):
    """Reconcile found an instance and the node's records disagreeing, and what it did about it."""

    node_id: uuid.UUID
    allocation_id: uuid.UUID | None = None
    instance_id: str
    problem: Literal["orphan_removed", "instance_missing", "instance_restarted"]
    detail: str = Field(default="", max_length=2000)


class MountVolume(Wire):
    """Mount a volume into a running allocation's slots (a live attach)."""

    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    export: VolumeExport


class UnmountVolume(Wire):
    """Unmount a volume from a running allocation's slots (a live detach; idempotent)."""

    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    volume_id: uuid.UUID


class VolumeMountChanged(Wire):
    """The outcome of a mount or unmount on the node (ok, or the reason)."""

    node_id: uuid.UUID
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    volume_id: uuid.UUID
    mounted: bool = Field(description="Whether the volume is mounted now.")
    ok: bool
    reason: str | None = Field(default=None, max_length=2000)
    mount: Mount | None = None


class ReadConsole(Wire):
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    offset: int = Field(default=-1, ge=-1, description="Byte offset to read from; -1: the last `limit` bytes.")
    limit: int = Field(default=65536, ge=1, le=1 << 20)


class ConsoleChunk(Wire):
    found: bool = Field(description="False: no console of this allocation (and tenant) on the node.")
    offset: int = Field(ge=0, description="Where `text` starts in the console log.")
    next_offset: int = Field(ge=0, description="Where the next read should start (follow).")
    text: str = ""
    running: bool = False


CONTRACT = ServiceContract(
    service="node_agent",
    title="Tessera node-agent",
    description="Runs on each node; provisions and deprovisions allocations through its driver and plumbs their tenant networks.",
    messages=[
        Message("node_agent.network_repaired", "node_agent.evt.network_repaired.{node_id}", NetworkRepaired, "event",
                "Reconcile found the node's network drifted and repaired one object."),
        Message("node_agent.power", "node_agent.cmd.power.{node_id}", RequestPower, "command",
                "A tenant's power action (reboot, stop, start) on its instance."),
        Message("node_agent.power_changed", "node_agent.evt.power_changed.{node_id}", PowerChanged, "event",
                "A power action was carried out, or failed (reason)."),
        Message("node_agent.instance_problem", "node_agent.evt.instance_problem.{node_id}", InstanceProblem, "event",
                "Reconcile found an orphan instance (removed) or an allocation whose instance vanished."),
        Message("node_agent.set_bmc", "node_agent.cmd.set_bmc.{node_id}", SetBmc, "command",
                "Register (or remove) the node's BMC; the password is sealed."),
        Message("node_agent.validate_bmc", "node_agent.rpc.bmc_validate.{node_id}", ValidateBmc, "request",
                "Check a BMC: reachable, credentials accepted; its power state, model and serial.", reply=BmcReport),
        Message("node_agent.rewipe", "node_agent.cmd.rewipe.{node_id}", Rewipe, "command",
                "A provider admin re-wipes a quarantined slot."),
        Message("node_agent.slot_rewiped", "node_agent.evt.slot_rewiped.{node_id}", SlotRewiped, "event",
                "A re-wipe ran (ok or not), with its evidence."),
        Message("node_agent.burn_in", "node_agent.cmd.burn_in.{node_id}", RunBurnIn, "command",
                "Burn in the node before it becomes schedulable."),
        Message("node_agent.burn_in_finished", "node_agent.evt.burn_in_finished.{node_id}", BurnInFinished, "event",
                "A burn-in run finished: passed or not, each check named."),
        Message("node_agent.mount_volume", "node_agent.cmd.mount_volume.{node_id}", MountVolume, "command",
                "Mount a volume into a running allocation's slots (live attach)."),
        Message("node_agent.unmount_volume", "node_agent.cmd.unmount_volume.{node_id}", UnmountVolume, "command",
                "Unmount a volume from a running allocation's slots (live detach)."),
        Message("node_agent.volume_mount_changed", "node_agent.evt.volume_mount_changed.{node_id}", VolumeMountChanged, "event",
                "A volume was mounted or unmounted on the node, or could not be (reason)."),
        Message("node_agent.read_console", "node_agent.rpc.console.{node_id}", ReadConsole, "request",
                "Read the serial console of an instance on this node (tail, or from an offset to follow).", reply=ConsoleChunk),
        Message("node_agent.heartbeat", "node_agent.evt.heartbeat.{node_id}", Heartbeat, "event",
                "The agent is alive: the node's current alerts, the instances it holds, its GPUs' metrics. "
                "Published live every few seconds, never stored.", live=True),
        Message("node_agent.inject_fault", "node_agent.cmd.inject_fault.{node_id}", InjectFault, "command",
                "A provider injects a fault into a simulated node (a real one refuses it)."),
        Message("node_agent.fault_injected", "node_agent.evt.fault_injected.{node_id}", FaultInjected, "event",
                "What the node did with an injected fault: accepted, or refused (reason)."),
        Message("node_agent.fence_instances", "node_agent.cmd.fence_instances.{node_id}", FenceInstances, "command",
                "These allocations moved to another node: destroy their instances here for good."),
        Message("node_agent.instances_fenced", "node_agent.evt.instances_fenced.{node_id}", InstancesFenced, "event",
                "The allocations' instances, and the node's records of them, are gone."),
    ],
    receives=["network.tenant_networks_changed", "node_agent.power", "node_agent.set_bmc", "node_agent.rewipe",
              "node_agent.burn_in", "node_agent.mount_volume", "node_agent.unmount_volume",
              "node_agent.inject_fault", "node_agent.fence_instances"],
    sends=["scheduler.report_topology"],
    steps=[PROVISION_NODE, WIPE_SLOTS, FENCE_NODE],
)

__all__ = ["Alert", "Condition", "FaultInjected", "FaultKind", "FenceInstances", "GpuMetrics", "Heartbeat",
           "InjectFault", "InstancesFenced", "Bmc", "BmcReport", "BurnInCheck", "BurnInFinished", "DeviceWipe",
           "QuarantinedSlot", "Rewipe", "RunBurnIn", "SetBmc", "SlotRewiped", "SlotsWiped", "SlotWipe", "ValidateBmc",
           "WipeSlots", "FenceNode", "NodeFenced", "NodeFenceFailed", "CONTRACT", "PROVISION_NODE", "WIPE_SLOTS",
           "FENCE_NODE"]
