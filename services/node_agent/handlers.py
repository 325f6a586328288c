"""The node-agent's saga-step handlers: provision and deprovision an allocation through the driver.

Both run inside the consumer's transaction: the driver acts first, the row and
the reply commit after it. A crash between the two leaves an instance with no
row; the redelivered command finds it again (drivers are idempotent per
allocation), and a compensation removes it whether or not a row exists.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import partial

import asyncpg
import structlog
from prometheus_client import Gauge

from shared.consumer import HandlerContext, PermanentError
from shared.participant import StepRejected, invoke, undo

from . import contracts as c
from .adapters import repository
from .domain.model import Instance, InstanceSpec, InvalidRequest, checked_slots
from .drivers import DriverError, ProvisioningDriver

log = structlog.get_logger()

INSTANCES = Gauge("tessera_node_instances", "Instances on the node, as its driver reports them", ["node_id"])


@dataclass(frozen=True)
class Node:
    """The node this process serves: its id, its driver, and whether sim fault labels apply."""

    id: uuid.UUID
    driver: ProvisioningDriver
    sim_faults: bool = False

    @property
    def subject_params(self) -> dict[str, str]:
        return {"node_id": str(self.id)}


async def refresh_gauge(node: Node) -> None:
    """Set the instance gauge from the driver (never raises: a metric must not fail a step)."""
    try:
        INSTANCES.labels(str(node.id)).set(len(await node.driver.list_instances()))
    except Exception as exc:
        log.warning("node_agent.gauge_refresh_failed", node_id=str(node.id), error=repr(exc))


def _addressed_here(node: Node, cmd: c.ProvisionNode | c.DeprovisionNode) -> None:
    if cmd.node_id != node.id:
        raise PermanentError(f"command for node {cmd.node_id} arrived at node {node.id}")


def _spec(cmd: c.ProvisionNode) -> InstanceSpec:
    return InstanceSpec(cmd.allocation_id, cmd.tenant_id, cmd.node_id, checked_slots(cmd.slots),
                        cmd.volume_id, cmd.ip_address, cmd.mac_address)


async def _provision(node: Node, conn: asyncpg.Connection, cmd: c.ProvisionNode) -> dict:
    try:
        spec = _spec(cmd)
        instance_id = await node.driver.provision(spec)
    except (InvalidRequest, DriverError) as exc:
        raise StepRejected(str(exc)) from exc
    await repository.record(conn, node.id, Instance(cmd.allocation_id, instance_id, spec.slots))
    log.info("node_agent.provisioned", allocation_id=str(cmd.allocation_id), instance_id=instance_id)
    return {"node_id": node.id, "instance_id": instance_id}


async def _deprovision(node: Node, conn: asyncpg.Connection, cmd: c.DeprovisionNode) -> dict:
    # the driver is asked even without a row: a crash may have left an instance that never got one
    await node.driver.deprovision(cmd.allocation_id)
    gone = await repository.forget(conn, node.id, cmd.allocation_id)
    log.info("node_agent.deprovisioned", allocation_id=str(cmd.allocation_id), instance_id=gone)
    return {"node_id": node.id}


async def provision_node(ctx: HandlerContext, cmd: c.ProvisionNode, *, node: Node) -> None:
    """Provision once per idempotency key; replies node_provisioned or node_provision_failed."""
    _addressed_here(node, cmd)
    await repository.lock_allocation(ctx.conn, node.id, cmd.allocation_id)
    await invoke(ctx, cmd, partial(_provision, node), succeeded="node_agent.node_provisioned",
                 failed="node_agent.node_provision_failed", reply_model=c.NodeProvisioned,
                 failure_model=c.NodeProvisionFailed, sim_faults=node.sim_faults, subject_params=node.subject_params)
    await refresh_gauge(node)


async def deprovision_node(ctx: HandlerContext, cmd: c.DeprovisionNode, *, node: Node) -> None:
    """Remove the allocation (idempotent); a driver error propagates, so the command is retried, then dead-lettered."""
    _addressed_here(node, cmd)
    await repository.lock_allocation(ctx.conn, node.id, cmd.allocation_id)
    await undo(ctx, cmd, partial(_deprovision, node), undone="node_agent.node_deprovisioned",
               reply_model=c.NodeDeprovisioned, subject_params=node.subject_params)
    await refresh_gauge(node)
