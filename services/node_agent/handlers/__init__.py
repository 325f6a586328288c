"""The node-agent's handlers: provisioning (saga steps, tenant networks), running instances (power, console,
reconcile) and their volumes mounted live."""
from .hardware import burn_in, rewipe, set_bmc, stored_bmc, validate_bmc, wipe_slots
from .instances import power, power_refused, read_console, reconcile_instances
from .provisioning import (Node, deprovision_node, instance_info, load_network, provision_node, reconcile_network,
                           refresh_gauge, tenant_networks_changed)
from .volumes import mount_volume, unmount_volume, volume_refused

__all__ = ["burn_in", "rewipe", "set_bmc", "stored_bmc", "validate_bmc", "wipe_slots", "Node", "deprovision_node", "instance_info", "load_network", "power", "power_refused", "provision_node", "read_console",
           "reconcile_instances", "reconcile_network", "refresh_gauge", "tenant_networks_changed", "mount_volume",
           "unmount_volume", "volume_refused"]
