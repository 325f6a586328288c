"""The node-agent's own settings: which node it is, its name, its driver and its dataplane.

Read from the environment once, in bootstrap (``load_settings``; never at import time); a bad value
raises ``SettingError`` naming the variable. Variables (defaults in brackets):
  TESSERA_NODE_ID, or TESSERA_INSTANCE  this node's UUID, the kit's ``instance`` (required; when both are set
                                        they must agree)
  TESSERA_NODE_NAME                     [the node id] the node's name in its topology report
  TESSERA_NODE_DRIVER                   [sim] the driver's name in ``adapters.drivers.DRIVERS``: sim (in memory, no
                                        guest), libvirt (a QEMU domain per slot allocation; see
                                        ``adapters.drivers.libvirt.config`` for its TESSERA_LIBVIRT_* variables),
                                        redfish (the node is one bare-metal server provisioned through its BMC;
                                        see ``adapters.drivers.redfish.config`` for its TESSERA_REDFISH_* variables)
  TESSERA_NODE_DATAPLANE                [none] none: tenant networks are not plumbed; kernel: bridges, VXLAN,
                                        namespaces and nftables made real (needs root)
  TESSERA_NODE_NETNS                    [this process's] the network namespace the node's kernel objects live in
                                        (tests run several nodes in one kernel)
  TESSERA_NODE_UNDERLAY_DEV             [the default route's device] the device VXLAN runs over
  TESSERA_NODE_RECONCILE_S              [30] seconds between reconciles of the kernel state
  TESSERA_NODE_HEARTBEAT_S              [2] seconds between heartbeats (node_agent.heartbeat)
  TESSERA_NODE_HEALTH_PROBE             [auto] how the GPUs' health is read: auto, sim, nvml or none
                                        (``adapters.health``); only a sim probe accepts injected faults
  TESSERA_NODE_GPU_TEMP_LIMIT_C         [90] a GPU hotter than this raises a temperature alert
  TESSERA_NODE_GPU_POWER_LIMIT_W        [700] a GPU drawing more than this raises a power alert

The driver and the discovery read their own variables when bootstrap builds them: the sim driver
TESSERA_SIM_LATENCY_S and TESSERA_SIM_FAIL (``adapters.drivers.sim``), the libvirt driver TESSERA_LIBVIRT_*
(``adapters.drivers.libvirt.config``), the discovery
TESSERA_NODE_DISCOVERY and TESSERA_SIM_TOPOLOGY (``adapters.discovery``). Every driver reads the volume
settings, TESSERA_VOLUME_ROOTS (where btrfs volumes may be mounted from) and TESSERA_VOLUME_STATE_DIR
(``adapters.drivers.volumes``).
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from shared.settings import ServiceSettings, SettingError, load, setting

from .adapters.drivers import DRIVERS
from .adapters.health import PROBES

NODE_ID_VAR = "TESSERA_NODE_ID"
INSTANCE_VAR = "TESSERA_INSTANCE"
DATAPLANE_VAR = "TESSERA_NODE_DATAPLANE"
NETNS_VAR = "TESSERA_NODE_NETNS"
DATAPLANES = ("none", "kernel")


def _driver(raw: str) -> str:
    if raw not in DRIVERS:
        raise ValueError(raw)
    return raw


_driver.what = f"a driver; known drivers: {sorted(DRIVERS)}"   # type: ignore[attr-defined]


def _dataplane(raw: str) -> str:
    if raw not in DATAPLANES:
        raise ValueError(raw)
    return raw


_dataplane.what = "a dataplane: expected 'none' or 'kernel'"   # type: ignore[attr-defined]


def _seconds(raw: str) -> float:
    value = float(raw)
    if not value > 0:   # also refuses nan
        raise ValueError(raw)
    return value


_seconds.what = "a number of seconds (it must be positive)"   # type: ignore[attr-defined]


def _probe(raw: str) -> str:
    if raw not in PROBES:
        raise ValueError(raw)
    return raw


_probe.what = f"a health probe: one of {list(PROBES)}"   # type: ignore[attr-defined]


def _limit(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError(raw)
    return value


_limit.what = "a positive number"   # type: ignore[attr-defined]


@dataclass(frozen=True)
class NodeAgentSettings:
    """The node-agent's settings besides the kit's (the node id is the kit's ``instance``)."""

    node_name: str = setting("TESSERA_NODE_NAME", "", doc="the node's name in its topology report (empty: its id)")
    driver: str = setting("TESSERA_NODE_DRIVER", "sim", _driver, doc="the provisioning driver")
    dataplane: str = setting(DATAPLANE_VAR, "none", _dataplane, doc="none, or kernel: plumb tenant networks (root)")
    netns: str | None = setting(NETNS_VAR, None, doc="the network namespace of the node's kernel objects")
    underlay_dev: str | None = setting("TESSERA_NODE_UNDERLAY_DEV", None,
                                       doc="the device VXLAN runs over (unset: the default route's)")
    reconcile_s: float = setting("TESSERA_NODE_RECONCILE_S", 30.0, _seconds,
                                 doc="seconds between reconciles of the kernel state")
    heartbeat_s: float = setting("TESSERA_NODE_HEARTBEAT_S", 2.0, _seconds, doc="seconds between heartbeats")
    health_probe: str = setting("TESSERA_NODE_HEALTH_PROBE", "auto", _probe,
                                doc="how the GPUs' health is read: auto, sim, nvml or none")
    gpu_temp_limit_c: float = setting("TESSERA_NODE_GPU_TEMP_LIMIT_C", 90.0, _limit,
                                      doc="°C above which a GPU raises a temperature alert")
    gpu_power_limit_w: float = setting("TESSERA_NODE_GPU_POWER_LIMIT_W", 700.0, _limit,
                                       doc="W above which a GPU raises a power alert")


def node_id_from_env(environ: Mapping[str, str]) -> str | None:
    """The raw node id from TESSERA_NODE_ID or TESSERA_INSTANCE; raises SettingError when they disagree."""
    by_node = (environ.get(NODE_ID_VAR) or "").strip()
    by_instance = (environ.get(INSTANCE_VAR) or "").strip()
    if by_node and by_instance and by_node.lower() != by_instance.lower():
        raise SettingError(f"{NODE_ID_VAR}={by_node!r} and {INSTANCE_VAR}={by_instance!r} disagree: "
                           "they name the same node, set one of them")
    return by_node or by_instance or None


def parse_node_id(value: str | None) -> uuid.UUID:
    """This node's UUID (the kit's ``instance``); raises SettingError when it is missing or not a UUID."""
    if value is None or not value.strip() or value.strip() == "0":
        raise SettingError(f"{NODE_ID_VAR} (or {INSTANCE_VAR}) must be set to this node's UUID; "
                           "a node-agent serves exactly one node")
    try:
        return uuid.UUID(value.strip())
    except ValueError:
        raise SettingError(f"{NODE_ID_VAR} (or {INSTANCE_VAR})={value!r} is not a UUID") from None


def service_settings(environ: Mapping[str, str] | None = None) -> ServiceSettings:
    """The kit's settings of this node-agent; its ``instance`` is TESSERA_NODE_ID (or TESSERA_INSTANCE)."""
    environ = os.environ if environ is None else environ
    node_id = node_id_from_env(environ)
    return ServiceSettings.from_env("node_agent", environ, **({"instance": node_id} if node_id else {}))


def check_dataplane(settings: NodeAgentSettings, *, euid: int | None = None) -> None:
    """What no single reader can see: the kernel dataplane needs root and an existing namespace."""
    if settings.dataplane != "kernel":
        return
    if (os.geteuid() if euid is None else euid) != 0:
        raise SettingError(f"{DATAPLANE_VAR}=kernel needs root (namespaces, links, nftables); "
                           f"run as root or set {DATAPLANE_VAR}=none")
    if settings.netns is not None and not os.path.exists(f"/run/netns/{settings.netns}"):
        raise SettingError(f"{NETNS_VAR}={settings.netns!r}: no such network namespace")


def load_settings(environ: Mapping[str, str] | None = None, *, euid: int | None = None) -> NodeAgentSettings:
    """The node-agent's settings from ``environ`` (default: os.environ); raises SettingError naming the variable."""
    settings = load(NodeAgentSettings, environ)
    check_dataplane(settings, euid=euid)
    return settings
