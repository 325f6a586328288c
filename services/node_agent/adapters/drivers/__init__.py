"""Provisioning drivers by name; TESSERA_NODE_DRIVER picks one (see services.node_agent.settings), and the
bootstrap builds it from its own variables (``from_env``). Adapters: a real driver acts on the node."""
from __future__ import annotations

from .base import Console, DriverConfigError, DriverError, PowerAction, ProvisioningDriver
from .libvirt.driver import LibvirtDriver
from .redfish.driver import RedfishDriver
from .sim import SimDriver

DRIVERS: dict[str, type[ProvisioningDriver]] = {"sim": SimDriver, "libvirt": LibvirtDriver, "redfish": RedfishDriver}

__all__ = ["DRIVERS", "Console", "DriverConfigError", "DriverError", "LibvirtDriver", "PowerAction",
           "ProvisioningDriver", "RedfishDriver", "SimDriver"]
