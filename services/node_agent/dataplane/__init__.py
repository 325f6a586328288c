"""The node's tenant-network dataplane (issue 4): bridges, VXLAN, namespaces and nftables, made real.

model/names/render are pure; kernel/observe touch the kernel; reconcile plans
and applies differences; node holds the ``Dataplane`` the node-agent calls.
"""
from .kernel import Kernel, KernelError
from .model import DesiredNode, InvalidAttachment, desired_state
from .names import node_tag
from .node import Dataplane, KernelDataplane, NullDataplane
from .reconcile import Repair, plan

__all__ = ["Dataplane", "DesiredNode", "InvalidAttachment", "Kernel", "KernelDataplane", "KernelError",
           "NullDataplane", "Repair", "desired_state", "node_tag", "plan"]
