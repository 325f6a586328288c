"""The only place the node-agent's driver and adapters are built and wired."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from shared.config import ServiceSettings
from shared.runtime import Runtime

from . import config
from .drivers import ProvisioningDriver
from .entrypoints import bus
from .handlers import Node, refresh_gauge


def build(settings: ServiceSettings | None = None, *, driver: ProvisioningDriver | None = None,
          environ: Mapping[str, str] | None = None) -> Runtime:
    """Build (connect nothing) the node-agent of one node; raises config.ConfigError on bad settings.

    The node id is ``settings.instance``; from the environment it is TESSERA_NODE_ID
    or TESSERA_INSTANCE. ``driver`` overrides the one TESSERA_NODE_DRIVER names.
    """
    environ = os.environ if environ is None else environ
    if settings is None:
        raw = config.node_id_from_env(environ)
        settings = ServiceSettings.from_env("node_agent", **({"instance": raw} if raw else {}))
    node = Node(config.parse_node_id(settings.instance), driver or config.driver_from_env(environ), settings.sim_faults)
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, node)
    rt.readiness.append(("driver", _driver_check(node)))
    rt.background(lambda: refresh_gauge(node))   # runs once at start, so the gauge exists before any command
    return rt


def _driver_check(node: Node):
    """Readiness: the driver answers (list_instances raises when it cannot reach its hypervisor/BMC)."""
    async def driver_ready() -> bool:
        await node.driver.list_instances()
        return True
    return driver_ready
