"""The node-agent's handlers, each over the node it serves (``node.Node``, its ports): provisioning (saga steps,
tenant networks), running instances (power, console, reconcile), their volumes mounted live, the wipe of slots,
the node's hardware (burn-in, BMC), its health (heartbeats, injected faults, fencing) and the fence of a
moved allocation's old node (a saga step)."""
from .fence import fence_node, fence_step
from .hardware import burn_in, set_bmc, stored_bmc, validate_bmc
from .health import fence_instances, heartbeat, inject_fault
from .instances import power, power_refused, read_console, reconcile_instances
from .node import Node, RecordsFactory
from .provisioning import (
                           deprovision_node,
                           deprovision_step,
                           instance_info,
                           load_network,
                           provision_node,
                           provision_step,
                           reconcile_network,
                           refresh_gauge,
                           tenant_networks_changed,
)
from .volumes import mount_volume, unmount_volume, volume_refused
from .wipe import rewipe, wipe_slots, wipe_step

__all__ = ["burn_in", "set_bmc", "stored_bmc", "validate_bmc", "fence_instances", "heartbeat", "inject_fault",
           "fence_node", "fence_step", "power", "power_refused", "read_console", "reconcile_instances", "Node", "RecordsFactory",
           "deprovision_node", "deprovision_step", "instance_info", "load_network", "provision_node",
           "provision_step", "reconcile_network", "refresh_gauge", "tenant_networks_changed", "mount_volume",
           "unmount_volume", "volume_refused", "rewipe", "wipe_slots", "wipe_step"]
