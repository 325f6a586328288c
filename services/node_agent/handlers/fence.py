"""The fence of a moved allocation's old node: the reschedule saga's ``fence_node`` step, which it waits for
before it places the allocation anywhere else, so an allocation never runs in two places.

A bare-metal server (the ``redfish`` driver; its agent runs out of band, so it answers while the server is
sick) is powered off through its BMC and its power state read back as Off (the driver's power_off phase, bounded
by its timeout). Any other driver removes the instance. Then the node forgets the instance, its kept command and
its network attachment, as the fence of a returning node does, so no reconcile brings it back. A fence that is
not confirmed (the BMC refuses, or the server is not Off in time) is refused: the saga fails the allocation and
places nothing, safety before availability. One effect per idempotency key (``shared.participant.invoke``).
"""
from __future__ import annotations

import time
from functools import partial

import structlog

from shared.participant import StepRejected, invoke, over
from shared.refusals import PermanentError
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.drivers import DriverError, RedfishDriver
from ..domain.ports import NodeRecords
from .node import Node
from .provisioning import refresh_gauge, remove_allocation

log = structlog.get_logger()


async def fence_step(records: NodeRecords, cmd: c.FenceNode, *, node: Node) -> dict:
    """The step's effect: the allocation runs no more on the node (bare metal: powered off, confirmed), and the
    node's records of it are gone; returns the reply's fields. An absent instance is fenced already (idempotent).
    Raises StepRejected when the fence cannot be confirmed (the records are kept then)."""
    began = time.monotonic()
    try:
        if isinstance(node.driver, RedfishDriver):
            await node.driver.fence(cmd.allocation_id)
        gone = await remove_allocation(records, cmd.allocation_id, node=node)
    except DriverError as exc:
        raise StepRejected(f"fence not confirmed: {exc}") from exc
    seconds = round(time.monotonic() - began, 3)
    log.warning("node_agent.node_fenced", node_id=str(node.id), allocation_id=str(cmd.allocation_id),
                instance_id=gone, driver=node.driver.name, seconds=seconds)
    return {"node_id": node.id, "power_state": "off", "seconds": seconds}


async def fence_node(ctx: UnitOfWork, cmd: c.FenceNode, *, node: Node) -> None:
    """Fence once per idempotency key; replies node_fenced or node_fence_failed."""
    if cmd.node_id != node.id:
        raise PermanentError(f"fence for node {cmd.node_id} arrived at node {node.id}")
    await node.records(ctx.conn).lock_allocation(cmd.allocation_id)
    await invoke(ctx, cmd, over(node.records, partial(fence_step, node=node)), step=c.FENCE_NODE,
                 sim_faults=node.sim_faults, subject_params=node.subject_params)
    ctx.on_commit(partial(refresh_gauge, node))
