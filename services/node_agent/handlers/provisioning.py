"""The node-agent's saga-step handlers: provision and deprovision an allocation through the driver,
plumbing its tenant network through the dataplane around it.

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
from functools import partial

import asyncpg
import structlog
from prometheus_client import Gauge

from services.network.contracts import TenantNetworks
from shared.outbox import Outbox
from shared.participant import StepRejected, invoke, over, undo
from shared.refusals import PermanentError
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.dataplane import KernelError
from ..adapters.drivers import DriverError
from ..domain.dataplane.model import InvalidAttachment
from ..domain.dataplane.reconcile import Repair
from ..domain.model import Instance, InvalidRequest
from ..domain.ports import NodeRecords
from .node import Node
from .spec import instance_spec

log = structlog.get_logger()

INSTANCES = Gauge("tessera_node_instances", "Instances on the node, as its driver reports them", ["node_id"])


async def refresh_gauge(node: Node) -> None:
    """Set the instance gauge from the driver (never raises: a metric must not fail a step)."""
    try:
        INSTANCES.labels(str(node.id)).set(len(await node.driver.list_instances()))
    except Exception as exc:
        log.warning("node_agent.gauge_refresh_failed", node_id=str(node.id), error=repr(exc))


def _addressed_here(node: Node, cmd: c.ProvisionNode | c.DeprovisionNode) -> None:
    if cmd.node_id != node.id:
        raise PermanentError(f"command for node {cmd.node_id} arrived at node {node.id}")


async def instance_info(node: Node, allocation_id: uuid.UUID, instance_id: str) -> c.InstanceInfo:
    """What the tenant sees of the instance (driver, dataplane, passthrough, boot time ...)."""
    details = await node.driver.instance_info(allocation_id)
    return c.InstanceInfo(instance_id=instance_id, driver=node.driver.name, dataplane=node.dataplane.kind,
                          node_id=node.id, **details)


async def _plumb(node: Node, records: NodeRecords, cmd: c.ProvisionNode) -> bool:
    """Record and plumb the attachment when one is given and the dataplane is real; True when it did.
    Raises StepRejected for an attachment that cannot be plumbed (the kernel is left as it was)."""
    if cmd.attachment is None or node.dataplane.kind == "none":
        return False
    tenant = cmd.tenant_networks
    if tenant is None or tenant.tenant_id != cmd.tenant_id or cmd.attachment.allocation_id != cmd.allocation_id:
        raise StepRejected("network: the attachment needs the tenant_networks of the command's tenant and allocation")
    tenant = await records.keep_tenant(tenant)
    await records.record_attachment(cmd.tenant_id, cmd.attachment)
    try:
        await node.plumbing(node.dataplane.attach, tenant, cmd.attachment)
    except (InvalidAttachment, KernelError) as exc:
        raise StepRejected(f"network: {exc}") from exc
    return True


async def provision_step(records: NodeRecords, cmd: c.ProvisionNode, *, node: Node) -> dict:
    """The step's effect (the network plumbed, the instance made and recorded); returns the reply's fields.
    Raises StepRejected, leaving no network behind, when the request or the driver refuses it."""
    try:
        spec = instance_spec(cmd, await node.guest_mtu())
        plumbed = await _plumb(node, records, cmd)
        try:
            instance_id = await node.driver.provision(spec)
        except BaseException:
            if plumbed:   # the step fails or is retried: leave no network behind either way
                await node.plumbing(node.dataplane.detach, cmd.allocation_id)
            raise
    except (InvalidRequest, DriverError) as exc:
        raise StepRejected(str(exc)) from exc
    await records.record_instance(Instance(cmd.allocation_id, instance_id, spec.slots), cmd)
    info = await instance_info(node, cmd.allocation_id, instance_id)
    log.info("node_agent.provisioned", allocation_id=str(cmd.allocation_id), instance_id=instance_id,
             driver=node.driver.name, passthrough=info.passthrough, boot_s=info.boot_s)
    return {"node_id": node.id, "instance_id": instance_id, "instance": info.model_dump(mode="json")}


async def remove_allocation(records: NodeRecords, allocation_id: uuid.UUID, *, node: Node) -> str | None:
    """Nothing of the allocation left on the node: its instance, its network, its records (the kept command
    with them, so no reconcile makes it again). Safe when never made; the instance id it had, or None. The
    caller holds the allocation's lock."""
    # the driver is asked even without a row: a crash may have left an instance that never got one
    await node.driver.deprovision(allocation_id)
    await node.plumbing(node.dataplane.detach, allocation_id)
    await records.forget_attachment(allocation_id)
    return await records.forget_instance(allocation_id)


async def deprovision_step(records: NodeRecords, cmd: c.DeprovisionNode, *, node: Node) -> dict:
    """Undo's effect: nothing of the allocation left on the node, nor in its records (safe when never made)."""
    gone = await remove_allocation(records, cmd.allocation_id, node=node)
    log.info("node_agent.deprovisioned", allocation_id=str(cmd.allocation_id), instance_id=gone)
    return {"node_id": node.id}


async def provision_node(ctx: UnitOfWork, cmd: c.ProvisionNode, *, node: Node) -> None:
    """Provision once per idempotency key; replies node_provisioned or node_provision_failed."""
    _addressed_here(node, cmd)
    await node.records(ctx.conn).lock_allocation(cmd.allocation_id)
    await invoke(ctx, cmd, over(node.records, partial(provision_step, node=node)), step=c.PROVISION_NODE,
                 sim_faults=node.sim_faults, subject_params=node.subject_params)
    ctx.on_commit(partial(refresh_gauge, node))   # after the reply is handed over: listing may wait on libvirt


async def deprovision_node(ctx: UnitOfWork, cmd: c.DeprovisionNode, *, node: Node) -> None:
    """Remove the allocation (idempotent); a driver error propagates, so the command is retried, then dead-lettered."""
    _addressed_here(node, cmd)
    await node.records(ctx.conn).lock_allocation(cmd.allocation_id)
    await undo(ctx, cmd, over(node.records, partial(deprovision_step, node=node)), step=c.PROVISION_NODE,
               subject_params=node.subject_params)
    ctx.on_commit(partial(refresh_gauge, node))


async def tenant_networks_changed(ctx: UnitOfWork, tenant: TenantNetworks, *, node: Node) -> None:
    """Keep the highest snapshot version per tenant and re-plumb its networks and rules if it has slots here.
    An older or repeated snapshot changes nothing; a kernel error propagates (retried, then dead-lettered)."""
    if node.dataplane.kind == "none":
        return
    kept = await node.records(ctx.conn).keep_tenant(tenant)
    if kept.version == tenant.version:
        try:
            await node.plumbing(node.dataplane.update_tenant, tenant)
        except InvalidAttachment as exc:   # e.g. a network removed while a slot here still uses it: never fits
            raise PermanentError(f"tenant {tenant.tenant_id} v{tenant.version}: {exc}") from exc


async def load_network(node: Node, pool: asyncpg.Pool) -> None:
    """Give the dataplane the desired inputs stored before a restart (no kernel change)."""
    async with pool.acquire() as conn:
        tenants, attachments = await node.records(conn).desired_network()
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
