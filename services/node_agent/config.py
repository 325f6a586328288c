"""The node-agent's own settings: which node it is and which driver acts on it.

Read from the environment once, in bootstrap. Variables:
- TESSERA_NODE_ID, or TESSERA_INSTANCE (the same setting under the kit's generic
  name): this node's UUID. Required; when both are set they must agree.
- TESSERA_NODE_DRIVER: the driver's name in ``drivers.DRIVERS`` (default "sim"),
  which reads its own variables (the sim driver: TESSERA_SIM_LATENCY_S, TESSERA_SIM_FAIL).
"""
from __future__ import annotations

import uuid
from typing import Mapping

from .drivers import DRIVERS, DriverConfigError, ProvisioningDriver

NODE_ID_VAR = "TESSERA_NODE_ID"
INSTANCE_VAR = "TESSERA_INSTANCE"
DRIVER_VAR = "TESSERA_NODE_DRIVER"
DEFAULT_DRIVER = "sim"


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
