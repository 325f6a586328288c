"""The node-agent's background work: at start, the instance gauge, the topology report and the load of the
stored network state; then, periodically, the heartbeat and the network and instance reconciles.

Every loop runs on every replica: each agent is its own node's only replica, and reconciles that node alone."""
from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial

import structlog

from services.scheduler.contracts import ReportTopology
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from ..adapters.discovery import DiscoveryError
from ..contracts import Heartbeat
from ..domain.health import GpuHealthProbe
from ..handlers import Node, heartbeat, load_network, reconcile_instances, reconcile_network, refresh_gauge

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


async def load_stored_network(rt: Runtime, node: Node) -> None:
    """Once at start (again after an error): the stored desired state, before any command or reconcile acts."""
    await load_network(node, rt.pool)


async def network_reconcile(rt: Runtime, node: Node) -> None:
    """One reconcile of the node's network plumbing against its stored state, once that is loaded."""
    await node.loaded.wait()
    await reconcile_network(node, rt.pool, rt.outbox)


async def instance_reconcile(rt: Runtime, node: Node) -> None:
    """The driver's instances against the node's records, once the stored state is loaded (an orphan's network
    is detached through the loaded dataplane)."""
    await node.loaded.wait()
    await reconcile_instances(node, rt.pool, rt.outbox)


async def publish_heartbeat(rt: Runtime, node: Node, seq: Iterator[int]) -> Heartbeat | None:
    """One heartbeat, published live: a plain core-NATS publish, never through the outbox nor into a stream, since
    it must prove the agent is connected now. None while an injected fault keeps the agent silent, or while the
    connection is down (the client would buffer the heartbeat and send it, stale, on reconnecting)."""
    if node.faults.silent(datetime.now(UTC)) or not rt.broker.connection.is_connected:
        return None
    await node.slowed()
    beat = await heartbeat(node, rt.pool, next(seq))
    subject = rt.catalog.message("node_agent.heartbeat").render_subject(**node.subject_params)
    rt.catalog.check_send(rt.service, "node_agent.heartbeat", subject)
    env = rt.outbox.envelope("node_agent.heartbeat", beat, correlation_id=str(node.id), tenant_id=None, causation=None)
    await rt.broker.connection.publish(subject, env.model_dump_json().encode(), headers=env.headers())
    return beat


async def watch_xid_events(node_id: uuid.UUID, probe: GpuHealthProbe, wait_ms: int = 1000) -> None:
    """For the life of the process: wait for the GPUs' XID events (NVML's event wait, in a thread, a second at a
    time so a stop is prompt). The probe keeps the last XID per GPU, which the heartbeats report as an alert."""
    while True:
        for event in await asyncio.to_thread(probe.events, wait_ms):
            log.warning("node_agent.gpu_xid", node_id=str(node_id), gpu=event.gpu, code=event.code)


def wire(rt: Runtime, node: Node, *, node_name: str, discovery: tuple[str, Callable[[str], dict]],
         reconcile_s: float, heartbeat_s: float = 2.0) -> None:
    """Register the background work; the network reconcile only when the node plumbs networks, the instance
    reconcile only when its instances outlive the agent."""
    rt.background(partial(refresh_gauge, node))   # runs once at start, so the gauge exists before any command
    rt.background(partial(report_topology, rt, node, node_name, *discovery))
    rt.every(heartbeat_s, partial(publish_heartbeat, rt, node, itertools.count()), at_once=True)
    if node.probe is not None and not node.probe.simulates:   # a simulated XID is in the samples at once
        rt.background(partial(watch_xid_events, node.id, node.probe))
    if node.dataplane.kind != "none":
        rt.background(partial(load_stored_network, rt, node))
        # per node: this agent is its node's only replica
        rt.every(reconcile_s, partial(network_reconcile, rt, node), at_once=True)
    else:
        node.loaded.set()
    if node.driver.persistent:   # per node, as above
        rt.every(reconcile_s, partial(instance_reconcile, rt, node), at_once=True)
