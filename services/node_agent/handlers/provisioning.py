"""The node-agent's saga-step handlers: provision and deprovision an allocation through the driver,
plumbing its tenant network through the dataplane around it (issue 4).

Both run inside the consumer's transaction: the driver acts first, the row and
the reply commit after it. A crash between the two leaves an instance with no
row; the redelivered command finds it again (drivers are idempotent per
allocation), and a compensation removes it whether or not a row exists. The
network is plumbed before the driver provisions and unplumbed after it
deprovisions; the dataplane is idempotent too, and the periodic reconcile
repairs what a crash in between left.
"""
from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import asyncpg
import structlog
from prometheus_client import Gauge

from shared.unit_of_work import UnitOfWork
from shared.refusals import PermanentError
from services.network.contracts import TenantNetworks
from shared.outbox import Outbox
from shared.participant import StepRejected, invoke, undo

from .. import contracts as c
from ..adapters import network as netrepo
from ..adapters import repository
from ..adapters.dataplane import Dataplane, KernelError, NullDataplane
from ..adapters.drivers import DriverError, ProvisioningDriver
from ..domain.dataplane.model import InvalidAttachment
from ..domain.dataplane.reconcile import Repair
from ..domain.dataplane.names import slot_port_name
from ..domain.model import BootImage, GuestConfig, Instance, InstanceSpec, InvalidRequest, NicConfig, checked_slots
from ..domain.vm.domain_xml import SlotDevices
from ..domain.volumes import Volume, check_distinct

log = structlog.get_logger()

INSTANCES = Gauge("tessera_node_instances", "Instances on the node, as its driver reports them", ["node_id"])


@dataclass(frozen=True)
class Node:
    """The node this process serves: its id, its driver, whether sim fault labels apply, its dataplane."""

    id: uuid.UUID
    driver: ProvisioningDriver
    sim_faults: bool = False
    dataplane: Dataplane = field(default_factory=NullDataplane)
    # one thread for every kernel call: pyroute2's sync sockets stay on the thread that made them
    kernel_thread: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "dataplane"), repr=False)
    # the wipe engine (release and re-wipe), the burn-in checks and the platform key that opens the BMC password
    wiper: Any = None
    burn_in: Any = None
    secret_key: bytes | None = field(default=None, repr=False)
    # set once the stored desired state is loaded: a command handled before that would be undone by the load
    loaded: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    async def guest_mtu(self) -> int | None:
        """The MTU of the node's tenant networks for a guest NIC (None without a dataplane)."""
        if self.dataplane.kind == "none":
            return None
        try:
            return await self.plumbing(self.dataplane.guest_mtu)
        except KernelError as exc:
            raise InvalidRequest(f"network: {exc}") from exc

    async def plug(self, allocation_id: uuid.UUID) -> None:
        """The driver started the allocation's VM: plug its tap into the tenant network (guest ports only)."""
        if self.dataplane.kind != "none":
            await self.plumbing(self.dataplane.plug, allocation_id)

    async def plumbing(self, fn, *args):
        """Run a blocking dataplane call on the node's kernel thread, once the stored state is loaded."""
        if self.dataplane.kind != "none":
            await self.loaded.wait()
        return await asyncio.get_running_loop().run_in_executor(self.kernel_thread, fn, *args)

    @property
    def subject_params(self) -> dict[str, str]:
        return {"node_id": str(self.id)}

    async def driver_ready(self) -> bool:
        """Readiness: the driver answers (list_instances raises when it cannot reach its hypervisor/BMC)."""
        await self.driver.list_instances()
        return True

    async def close(self) -> None:
        """At stop: release the dataplane's kernel sockets on their thread, then the thread."""
        await asyncio.get_running_loop().run_in_executor(self.kernel_thread, self.dataplane.close)
        self.kernel_thread.shutdown(wait=False)


async def refresh_gauge(node: Node) -> None:
    """Set the instance gauge from the driver (never raises: a metric must not fail a step)."""
    try:
        INSTANCES.labels(str(node.id)).set(len(await node.driver.list_instances()))
    except Exception as exc:
        log.warning("node_agent.gauge_refresh_failed", node_id=str(node.id), error=repr(exc))


def _addressed_here(node: Node, cmd: c.ProvisionNode | c.DeprovisionNode) -> None:
    if cmd.node_id != node.id:
        raise PermanentError(f"command for node {cmd.node_id} arrived at node {node.id}")


def _guest(guest: c.Guest | None) -> GuestConfig | None:
    if guest is None:
        return None
    i = guest.image
    return GuestConfig(BootImage(i.name, i.format, i.source, i.sha256, i.min_disk_gb, i.kernel, i.initrd, i.kernel_args),
                       guest.hostname, tuple(guest.ssh_keys), tuple(guest.dns))


def _nic(cmd: c.ProvisionNode, mtu: int | None) -> NicConfig | None:
    att, tenant = cmd.attachment, cmd.tenant_networks
    if att is None:
        return None
    gateway = next((n.gateway_ip for n in (tenant.networks if tenant else []) if n.network_id == att.network_id), None)
    return NicConfig(slot_port_name(att.attachment_id), att.mac_address.lower(), att.ip_address, att.prefix_len, gateway,
                     mtu)


def _spec(cmd: c.ProvisionNode, mtu: int | None = None) -> InstanceSpec:
    """The driver's view of the command; raises InvalidRequest (the step fails) for a detail no driver can use."""
    try:
        devices = tuple(SlotDevices(d.index, d.gpu_pci, d.nvme_pci, d.ib_vf_pci, d.ib_guid, d.numa, d.cpu_cores,
                                    d.memory_gb) for d in cmd.slot_details)
    except ValueError as exc:
        raise InvalidRequest(f"slot details: {exc}") from None
    return InstanceSpec(cmd.allocation_id, cmd.tenant_id, cmd.node_id, checked_slots(cmd.slots),
                        cmd.volume_id, cmd.ip_address, cmd.mac_address, devices, _guest(cmd.guest), _nic(cmd, mtu),
                        volumes(cmd.volumes))


def volumes(exports) -> tuple[Volume, ...]:
    """The domain's view of storage's exports; raises InvalidRequest for one no node can mount (or a clash)."""
    try:
        return check_distinct(Volume.of(e.volume_id, e.name, e.mode, e.backend, e.source, e.options) for e in exports)
    except ValueError as exc:
        raise InvalidRequest(f"volumes: {exc}") from None


async def instance_info(node: Node, allocation_id: uuid.UUID, instance_id: str) -> c.InstanceInfo:
    """What the tenant sees of the instance (driver, dataplane, passthrough, boot time ...)."""
    details = await node.driver.instance_info(allocation_id)
    return c.InstanceInfo(instance_id=instance_id, driver=node.driver.name, dataplane=node.dataplane.kind,
                          node_id=node.id, **details)


async def _plumb(node: Node, conn: asyncpg.Connection, cmd: c.ProvisionNode) -> bool:
    """Record and plumb the attachment when one is given and the dataplane is real; True when it did.
    Raises StepRejected for an attachment that cannot be plumbed (the kernel is left as it was)."""
    if cmd.attachment is None or node.dataplane.kind == "none":
        return False
    tenant = cmd.tenant_networks
    if tenant is None or tenant.tenant_id != cmd.tenant_id or cmd.attachment.allocation_id != cmd.allocation_id:
        raise StepRejected("network: the attachment needs the tenant_networks of the command's tenant and allocation")
    tenant = await netrepo.keep_tenant(conn, node.id, tenant)
    await netrepo.record_attachment(conn, node.id, cmd.tenant_id, cmd.attachment)
    try:
        await node.plumbing(node.dataplane.attach, tenant, cmd.attachment)
    except (InvalidAttachment, KernelError) as exc:
        raise StepRejected(f"network: {exc}") from exc
    return True


async def _provision(node: Node, conn: asyncpg.Connection, cmd: c.ProvisionNode) -> dict:
    try:
        spec = _spec(cmd, await node.guest_mtu())
        plumbed = await _plumb(node, conn, cmd)
        try:
            instance_id = await node.driver.provision(spec)
        except BaseException:
            if plumbed:   # the step fails or is retried: leave no network behind either way
                await node.plumbing(node.dataplane.detach, cmd.allocation_id)
            raise
    except (InvalidRequest, DriverError) as exc:
        raise StepRejected(str(exc)) from exc
    await repository.record(conn, node.id, Instance(cmd.allocation_id, instance_id, spec.slots), cmd)
    info = await instance_info(node, cmd.allocation_id, instance_id)
    log.info("node_agent.provisioned", allocation_id=str(cmd.allocation_id), instance_id=instance_id,
             driver=node.driver.name, passthrough=info.passthrough, boot_s=info.boot_s)
    return {"node_id": node.id, "instance_id": instance_id, "instance": info.model_dump(mode="json")}


async def _deprovision(node: Node, conn: asyncpg.Connection, cmd: c.DeprovisionNode) -> dict:
    # the driver is asked even without a row: a crash may have left an instance that never got one
    await node.driver.deprovision(cmd.allocation_id)
    await node.plumbing(node.dataplane.detach, cmd.allocation_id)
    await netrepo.forget_attachment(conn, node.id, cmd.allocation_id)
    gone = await repository.forget(conn, node.id, cmd.allocation_id)
    log.info("node_agent.deprovisioned", allocation_id=str(cmd.allocation_id), instance_id=gone)
    return {"node_id": node.id}


async def provision_node(ctx: UnitOfWork, cmd: c.ProvisionNode, *, node: Node) -> None:
    """Provision once per idempotency key; replies node_provisioned or node_provision_failed."""
    _addressed_here(node, cmd)
    await repository.lock_allocation(ctx.conn, node.id, cmd.allocation_id)
    await invoke(ctx, cmd, partial(_provision, node), step=c.PROVISION_NODE,
                 sim_faults=node.sim_faults, subject_params=node.subject_params)
    ctx.on_commit(partial(refresh_gauge, node))   # after the reply is handed over: listing may wait on libvirt


async def deprovision_node(ctx: UnitOfWork, cmd: c.DeprovisionNode, *, node: Node) -> None:
    """Remove the allocation (idempotent); a driver error propagates, so the command is retried, then dead-lettered."""
    _addressed_here(node, cmd)
    await repository.lock_allocation(ctx.conn, node.id, cmd.allocation_id)
    await undo(ctx, cmd, partial(_deprovision, node), step=c.PROVISION_NODE,
               subject_params=node.subject_params)
    ctx.on_commit(partial(refresh_gauge, node))


async def tenant_networks_changed(ctx: UnitOfWork, tenant: TenantNetworks, *, node: Node) -> None:
    """Keep the highest snapshot version per tenant and re-plumb its networks and rules if it has slots here.
    An older or repeated snapshot changes nothing; a kernel error propagates (retried, then dead-lettered)."""
    if node.dataplane.kind == "none":
        return
    kept = await netrepo.keep_tenant(ctx.conn, node.id, tenant)
    if kept.version == tenant.version:
        try:
            await node.plumbing(node.dataplane.update_tenant, tenant)
        except InvalidAttachment as exc:   # e.g. a network removed while a slot here still uses it: never fits
            raise PermanentError(f"tenant {tenant.tenant_id} v{tenant.version}: {exc}") from exc


async def load_network(node: Node, pool: asyncpg.Pool) -> None:
    """Give the dataplane the desired inputs stored before a restart (no kernel change)."""
    async with pool.acquire() as conn:
        tenants, attachments = await netrepo.load(conn, node.id)
    await asyncio.get_running_loop().run_in_executor(node.kernel_thread, node.dataplane.load, tenants, attachments)
    node.loaded.set()


async def reconcile_network(node: Node, pool: asyncpg.Pool, outbox: Outbox) -> list[Repair]:
    """Repair the kernel towards the desired state; each repair is emitted as node_agent.network_repaired."""
    repairs = await node.plumbing(node.dataplane.reconcile)
    if repairs:
        correlation = f"reconcile:{node.id}:{uuid.uuid4()}"
        async with UnitOfWork.begin(pool, outbox, name="node_agent.reconcile") as uow:
            await uow.emit_many([("node_agent.network_repaired", c.NetworkRepaired(
                node_id=node.id, action=r.action, object=f"{r.kind}:{r.name}", detail=r.detail), node.subject_params)
                for r in repairs], correlation_id=correlation)
        for r in repairs:
            log.warning("node_agent.network_repaired", node_id=str(node.id), action=r.action, kind=r.kind,
                        name=r.name, detail=r.detail)
    return repairs
