"""The only place the node-agent's driver, dataplane and discovery are built and wired."""
from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from shared.runtime import Runtime
from shared.secrets import SecretError, key_from_env
from shared.settings import ServiceSettings, SettingError

from .adapters.burn_in import BurnInConfigError, burn_in_from_env
from .adapters.dataplane import Dataplane, Kernel, KernelDataplane, NullDataplane
from .adapters.discovery import Discovery, DiscoveryError, discover_sim, discovery_from_env
from .adapters.drivers import DRIVERS, DriverConfigError, ProvisioningDriver
from .adapters.health import build_probe
from .adapters.records import PgNodeRecords
from .adapters.wipe import Wiper
from .domain.dataplane.names import node_tag
from .domain.health import GpuHealthProbe, Limits
from .entrypoints import bus, loops
from .handlers import Node, stored_bmc
from .settings import NodeAgentSettings, load_settings, parse_node_id, service_settings


def build_driver(name: str, environ: Mapping[str, str]) -> ProvisioningDriver:
    """The driver ``name``, built from its own variables (connects to nothing); raises SettingError."""
    try:
        return DRIVERS[name].from_env(environ)
    except DriverConfigError as exc:
        raise SettingError(f"driver {name!r}: {exc}") from None


def build_dataplane(settings: NodeAgentSettings, node_id: uuid.UUID, guest_ports: bool = False) -> Dataplane:
    """The dataplane the settings name; connects to nothing (the kernel is first touched on use). ``guest_ports``:
    the driver's instances bring their own taps (VMs), plugged rather than made."""
    if settings.dataplane == "none":
        return NullDataplane()
    return KernelDataplane(Kernel(node_tag(node_id), settings.netns, settings.underlay_dev), guest_ports)


def build_discovery(environ: Mapping[str, str]) -> tuple[str, Discovery]:
    """(name, discover) as TESSERA_NODE_DISCOVERY picks it; raises SettingError."""
    try:
        return discovery_from_env(environ)
    except DiscoveryError as exc:
        raise SettingError(str(exc)) from None


def build_health_probe(settings: NodeAgentSettings, driver: ProvisioningDriver, node_name: str,
                       environ: Mapping[str, str]) -> GpuHealthProbe | None:
    """The GPU health probe TESSERA_NODE_HEALTH_PROBE names; a sim probe models the node's simulated topology
    (TESSERA_SIM_TOPOLOGY). Raises SettingError when NVML cannot start or the topology is unknown."""
    kind = (environ.get("TESSERA_SIM_TOPOLOGY") or "hgx-h100-8").strip()
    try:
        return build_probe(settings.health_probe, devices_simulated=driver.devices_simulated,
                           topology=lambda: discover_sim(node_name, kind), seed=node_name)
    except (RuntimeError, DiscoveryError) as exc:
        raise SettingError(f"TESSERA_NODE_HEALTH_PROBE={settings.health_probe}: {exc}") from None


def build(settings: ServiceSettings | None = None, *, driver: ProvisioningDriver | None = None,
          environ: Mapping[str, str] | None = None) -> Runtime:
    """Build (connect nothing) the node-agent of one node; raises SettingError on a bad setting.

    The node id is ``settings.instance``; from the environment it is TESSERA_NODE_ID or TESSERA_INSTANCE.
    ``driver`` overrides the one TESSERA_NODE_DRIVER names; the node-agent's other settings are read
    from ``environ`` (default: os.environ; see settings).
    """
    environ = os.environ if environ is None else environ
    settings = settings or service_settings(environ)
    node_id = parse_node_id(settings.instance)
    own = load_settings(environ)
    driver = driver or build_driver(own.driver, environ)
    try:
        # a node whose slots' devices are simulated (sim; passthrough off) has no disks to wipe unless
        # TESSERA_WIPE_DEVICES names some: its wipes are simulated, and say so in their evidence
        wiper = Wiper.from_env(environ, simulate=driver.devices_simulated and not environ.get("TESSERA_WIPE_DEVICES"))
        burn_in = burn_in_from_env(environ)
        secret_key = key_from_env(environ)
    except (ValueError, SecretError, BurnInConfigError) as exc:
        raise SettingError(str(exc)) from None
    node_name = own.node_name or str(node_id)
    node = Node(id=node_id, driver=driver, records=partial(PgNodeRecords, node_id=node_id), wiper=wiper,
                burn_in=burn_in, sim_faults=settings.sim_faults,
                dataplane=build_dataplane(own, node_id, driver.guest_ports), secret_key=secret_key,
                probe=build_health_probe(own, driver, node_name, environ),
                limits=Limits(own.gpu_temp_limit_c, own.gpu_power_limit_w))
    discovery = build_discovery(environ)
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    # the node's part of the driver: an instance started is plugged into its network; bare metal's BMC is the
    # one the gateway registered for this node
    driver.bind(node_id, partial(discovery[1], node_name), instance_started=node.plug,
                bmc=lambda: stored_bmc(node, rt.pool))
    bus.wire(rt, node)
    loops.wire(rt, node, node_name=node_name, discovery=discovery, reconcile_s=own.reconcile_s,
               heartbeat_s=own.heartbeat_s)
    rt.readiness.append(("driver", node.driver_ready))
    rt.on_stop.append(node.close)
    rt.on_stop.append(driver.close)
    return rt
