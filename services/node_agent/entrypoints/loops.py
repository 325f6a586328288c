"""The node-agent's background work: the instance gauge at start, the topology report, the network reconcile."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

import structlog

from services.scheduler.contracts import ReportTopology
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from ..adapters.discovery import DiscoveryError
from ..handlers import Node, load_network, reconcile_instances, reconcile_network, refresh_gauge

log = structlog.get_logger()


async def report_topology(rt: Runtime, node: Node, node_name: str, discovery_name: str,
                          discover: Callable[[str], dict]) -> None:
    """Once at start: discover the node's hardware and report it to the scheduler, which proposes a slot map
    (a provider admin approves it before anything here is schedulable). A failed discovery is logged and the
    agent keeps serving what already runs here; the node then gets no new placements."""
    try:
        topology = await asyncio.to_thread(discover, node_name)
    except DiscoveryError as exc:
        log.error("node_agent.discovery_failed", node_id=str(node.id), discovery=discovery_name, error=str(exc))
        return
    async with UnitOfWork.begin(rt.pool, rt.outbox, name="node_agent.topology") as uow:
        await uow.emit("scheduler.report_topology", ReportTopology(
            node_id=node.id, driver=discovery_name, topology=topology), correlation_id=str(node.id),
            subject_params={"node_id": str(node.id)})
    log.info("node_agent.topology_reported", node_id=str(node.id), gpus=len(topology["gpus"]))


async def reconcile_forever(rt: Runtime, node: Node, every_s: float) -> None:
    """Load the stored desired state, then reconcile at once and every ``every_s`` seconds (a timer, not a wait)."""
    await load_network(node, rt.pool)
    while True:
        await reconcile_network(node, rt.pool, rt.outbox)
        await asyncio.sleep(every_s)


async def reconcile_instances_forever(rt: Runtime, node: Node, every_s: float) -> None:
    """At start and every ``every_s`` seconds: the driver's instances against the node's records."""
    await node.loaded.wait()   # an orphan's network is detached through the loaded dataplane
    while True:
        await reconcile_instances(node, rt.pool, rt.outbox)
        await asyncio.sleep(every_s)


def wire(rt: Runtime, node: Node, *, node_name: str, discovery: tuple[str, Callable[[str], dict]],
         reconcile_s: float) -> None:
    """Register the background work; the network reconcile only when the node plumbs networks, the instance
    reconcile only when its instances outlive the agent."""
    rt.background(partial(refresh_gauge, node))   # runs once at start, so the gauge exists before any command
    rt.background(partial(report_topology, rt, node, node_name, *discovery))
    if node.dataplane.kind != "none":
        rt.background(partial(reconcile_forever, rt, node, reconcile_s))
    else:
        node.loaded.set()
    if node.driver.persistent:
        rt.background(partial(reconcile_instances_forever, rt, node, reconcile_s))
