"""The kernel half of the node's tenant-network dataplane: bridges, VXLAN, namespaces and nftables, made real.

kernel/observe touch the kernel; repair carries out a reconcile plan against it;
node holds the ``Dataplane`` the node-agent calls. What the kernel should hold,
and the plan, are pure and live in ``services.node_agent.domain.dataplane``.
lab and probe are helpers for tests and the benchmark (network-namespace labs,
packet probes); no service code imports them.
"""
from .kernel import Kernel, KernelError
from .node import Dataplane, KernelDataplane, NullDataplane

__all__ = ["Dataplane", "Kernel", "KernelDataplane", "KernelError", "NullDataplane"]
