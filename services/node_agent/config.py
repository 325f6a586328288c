"""The node-agent's own settings: which node it is and which driver acts on it.

Read from the environment once, in bootstrap. Variables:
- TESSERA_NODE_ID, or TESSERA_INSTANCE (the same setting under the kit's generic
  name): this node's UUID. Required; when both are set they must agree.
- TESSERA_NODE_DRIVER: the driver's name in ``drivers.DRIVERS`` (default "sim"),
  which reads its own variables (the sim driver: TESSERA_SIM_LATENCY_S, TESSERA_SIM_FAIL).
- TESSERA_NODE_DATAPLANE: "none" (default: tenant networks are not plumbed) or "kernel"
  (bridges, VXLAN, namespaces and nftables made real; needs root).
- TESSERA_NODE_NETNS: the network namespace the node's kernel objects live in
  (unset: this process's own, as in production; tests run several nodes in one kernel).
- TESSERA_NODE_UNDERLAY_DEV: the device VXLAN runs over (default: the default route's device).
- TESSERA_NODE_RECONCILE_S: seconds between reconciles of the kernel state (default 30).
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Mapping

from .dataplane import Dataplane, Kernel, KernelDataplane, NullDataplane, node_tag
from .drivers import DRIVERS, DriverConfigError, ProvisioningDriver

NODE_ID_VAR = "TESSERA_NODE_ID"
INSTANCE_VAR = "TESSERA_INSTANCE"
DRIVER_VAR = "TESSERA_NODE_DRIVER"
DEFAULT_DRIVER = "sim"
DATAPLANE_VAR = "TESSERA_NODE_DATAPLANE"
NETNS_VAR = "TESSERA_NODE_NETNS"
UNDERLAY_VAR = "TESSERA_NODE_UNDERLAY_DEV"
RECONCILE_VAR = "TESSERA_NODE_RECONCILE_S"


class ConfigError(ValueError):
    """The node-agent cannot start with this configuration; the message says which variable to fix."""


def node_id_from_env(environ: Mapping[str, str]) -> str | None:
    """The raw node id from TESSERA_NODE_ID or TESSERA_INSTANCE; raises ConfigError when they disagree."""
    by_node = (environ.get(NODE_ID_VAR) or "").strip()
    by_instance = (environ.get(INSTANCE_VAR) or "").strip()
    if by_node and by_instance and by_node.lower() != by_instance.lower():
        raise ConfigError(f"{NODE_ID_VAR}={by_node!r} and {INSTANCE_VAR}={by_instance!r} disagree: "
                          "they name the same node, set one of them")
    return by_node or by_instance or None


def parse_node_id(value: str | None) -> uuid.UUID:
    """This node's UUID; raises ConfigError when it is missing or not a UUID."""
    if value is None or not value.strip() or value.strip() == "0":
        raise ConfigError(f"{NODE_ID_VAR} (or {INSTANCE_VAR}) must be set to this node's UUID; "
                          "a node-agent serves exactly one node")
    try:
        return uuid.UUID(value.strip())
    except ValueError:
        raise ConfigError(f"{NODE_ID_VAR} (or {INSTANCE_VAR})={value!r} is not a UUID") from None


def driver_from_env(environ: Mapping[str, str]) -> ProvisioningDriver:
    """The driver TESSERA_NODE_DRIVER names, built from its own variables; raises ConfigError."""
    name = (environ.get(DRIVER_VAR) or DEFAULT_DRIVER).strip()
    if name not in DRIVERS:
        raise ConfigError(f"{DRIVER_VAR}={name!r} is not a driver; known drivers: {sorted(DRIVERS)}")
    try:
        return DRIVERS[name].from_env(environ)
    except DriverConfigError as exc:
        raise ConfigError(f"driver {name!r}: {exc}") from None


@dataclass(frozen=True)
class DataplaneConfig:
    kind: str = "none"
    netns: str | None = None
    underlay_dev: str | None = None
    reconcile_s: float = 30.0


def dataplane_config_from_env(environ: Mapping[str, str], *, euid: int | None = None) -> DataplaneConfig:
    """The dataplane settings; raises ConfigError (kernel without root, a missing namespace, a bad interval)."""
    kind = (environ.get(DATAPLANE_VAR) or "none").strip()
    if kind not in ("none", "kernel"):
        raise ConfigError(f"{DATAPLANE_VAR}={kind!r}: expected 'none' or 'kernel'")
    try:
        reconcile_s = float(environ.get(RECONCILE_VAR) or 30)
    except ValueError:
        raise ConfigError(f"{RECONCILE_VAR}={environ.get(RECONCILE_VAR)!r} is not a number of seconds") from None
    if reconcile_s <= 0:
        raise ConfigError(f"{RECONCILE_VAR}={reconcile_s} must be positive")
    netns = (environ.get(NETNS_VAR) or "").strip() or None
    if kind == "kernel":
        if (os.geteuid() if euid is None else euid) != 0:
            raise ConfigError(f"{DATAPLANE_VAR}=kernel needs root (namespaces, links, nftables); "
                              f"run as root or set {DATAPLANE_VAR}=none")
        if netns is not None and not os.path.exists(f"/run/netns/{netns}"):
            raise ConfigError(f"{NETNS_VAR}={netns!r}: no such network namespace")
    return DataplaneConfig(kind, netns, (environ.get(UNDERLAY_VAR) or "").strip() or None, reconcile_s)


def build_dataplane(cfg: DataplaneConfig, node_id: uuid.UUID) -> Dataplane:
    """The dataplane the config names; connects to nothing (the kernel is first touched on use)."""
    if cfg.kind == "none":
        return NullDataplane()
    return KernelDataplane(Kernel(node_tag(node_id), cfg.netns, cfg.underlay_dev))
