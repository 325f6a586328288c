"""The only place the node-agent's driver and adapters are built and wired."""
from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

import structlog

from services.scheduler.contracts import ReportTopology
from shared.settings import ServiceSettings
from shared.runtime import Runtime

from . import config
from .discovery import DiscoveryError, discovery_from_env
from .drivers import ProvisioningDriver
from .entrypoints import bus
from .handlers import Node, load_network, reconcile_network, refresh_gauge

log = structlog.get_logger()


def build(settings: ServiceSettings | None = None, *, driver: ProvisioningDriver | None = None,
          environ: Mapping[str, str] | None = None) -> Runtime:
    """Build (connect nothing) the node-agent of one node; raises config.ConfigError on bad settings.

    The node id is ``settings.instance``; from the environment it is TESSERA_NODE_ID
    or TESSERA_INSTANCE. ``driver`` overrides the one TESSERA_NODE_DRIVER names;
    TESSERA_NODE_DATAPLANE and friends (see config) pick the network dataplane.
    """
    environ = os.environ if environ is None else environ
    if settings is None:
        raw = config.node_id_from_env(environ)
        settings = ServiceSettings.from_env("node_agent", **({"instance": raw} if raw else {}))
    node_id = config.parse_node_id(settings.instance)
    dataplane = config.dataplane_config_from_env(environ)
    node = Node(node_id, driver or config.driver_from_env(environ), settings.sim_faults,
                config.build_dataplane(dataplane, node_id))
    try:
        discovery_name, discover = discovery_from_env(environ)
    except DiscoveryError as exc:
        raise config.ConfigError(str(exc)) from None
    node_name = (environ.get("TESSERA_NODE_NAME") or "").strip() or str(node_id)
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, node)
    rt.readiness.append(("driver", _driver_check(node)))
    rt.background(lambda: refresh_gauge(node))   # runs once at start, so the gauge exists before any command
    rt.background(_reporter(rt, node, node_name, discovery_name, discover))
    if dataplane.kind != "none":
        rt.background(_reconciler(rt, node, dataplane.reconcile_s))

    async def release_kernel() -> None:
        await asyncio.get_running_loop().run_in_executor(node.kernel_thread, node.dataplane.close)
        node.kernel_thread.shutdown(wait=False)
    rt.on_stop.append(release_kernel)
    return rt


def _reconciler(rt: Runtime, node: Node, every_s: float):
    """Load the stored desired state, then reconcile at once and every ``every_s`` seconds (a timer, not a wait)."""
    async def reconcile_forever() -> None:
        await load_network(node, rt.pool)
        while True:
            await reconcile_network(node, rt.pool, rt.outbox)
            await asyncio.sleep(every_s)
    return reconcile_forever


def _reporter(rt: Runtime, node: Node, node_name: str, discovery_name: str, discover):
    """Once at start: discover the node's hardware and report it to the scheduler, which proposes a slot map
    (a provider admin approves it before anything here is schedulable). A failed discovery is logged and the
    agent keeps serving what already runs here; the node then gets no new placements."""
    async def report_topology() -> None:
        try:
            topology = await asyncio.to_thread(discover, node_name)
        except DiscoveryError as exc:
            log.error("node_agent.discovery_failed", node_id=str(node.id), discovery=discovery_name, error=str(exc))
            return
        async with rt.pool.acquire() as conn, conn.transaction():
            await rt.outbox.add(conn, "scheduler.report_topology", ReportTopology(
                node_id=node.id, driver=discovery_name, topology=topology), correlation_id=str(node.id))
        log.info("node_agent.topology_reported", node_id=str(node.id), gpus=len(topology["gpus"]))
    return report_topology


def _driver_check(node: Node):
    """Readiness: the driver answers (list_instances raises when it cannot reach its hypervisor/BMC)."""
    async def driver_ready() -> bool:
        await node.driver.list_instances()
        return True
    return driver_ready
