"""The node-agent's handlers: provisioning (saga steps, tenant networks) and running instances (power, console,
reconcile)."""
from .hardware import burn_in, rewipe, set_bmc, stored_bmc, validate_bmc, wipe_slots
from .instances import power, power_refused, read_console, reconcile_instances
from .provisioning import (Node, deprovision_node, instance_info, load_network, provision_node, reconcile_network,
                           refresh_gauge, tenant_networks_changed)

__all__ = ["burn_in", "rewipe", "set_bmc", "stored_bmc", "validate_bmc", "wipe_slots", "Node", "deprovision_node", "instance_info", "load_network", "power", "power_refused", "provision_node", "read_console",
           "reconcile_instances", "reconcile_network", "refresh_gauge", "tenant_networks_changed"]
