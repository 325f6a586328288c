"""Hardware discovery: what GPUs, NVMe devices, InfiniBand VFs and NUMA nodes this node has.

The node-agent reports the result to the scheduler (``scheduler.report_topology``)
at start; the scheduler derives a proposed slot map that a provider admin must
approve before anything on the node is schedulable. The document is
``services.scheduler.contracts.topology.NodeTopology.to_dict()``.

Discoveries, chosen by TESSERA_NODE_DISCOVERY:
  sim   a realistic simulated topology (TESSERA_SIM_TOPOLOGY, default hgx-h100-8)
  nvml  the real GPUs through NVML (nvidia-ml-py) plus sysfs for NUMA, NVMe and IB VFs;
        fails at start, with one clear line, on a host without a usable NVIDIA driver
  auto  (default) nvml when NVML works on this host, otherwise sim
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from .nvml import DiscoveryError, NvmlUnavailable, discover_nvml
from .sim import discover_sim

DISCOVERY_VAR = "TESSERA_NODE_DISCOVERY"

Discovery = Callable[[str], dict]


def discovery_from_env(environ: Mapping[str, str]) -> tuple[str, Discovery]:
    """(name, function(node_name) -> topology document); raises DiscoveryError for a bad setting."""
    name = (environ.get(DISCOVERY_VAR) or "auto").strip()
    kind = (environ.get("TESSERA_SIM_TOPOLOGY") or "hgx-h100-8").strip()
    if name == "sim":
        return "sim", lambda node_name: discover_sim(node_name, kind)
    if name == "nvml":
        return "nvml", lambda _node_name: discover_nvml()
    if name == "auto":
        def auto(node_name: str) -> dict:
            try:
                return discover_nvml()
            except NvmlUnavailable:
                return discover_sim(node_name, kind)
        return "auto", auto
    raise DiscoveryError(f"{DISCOVERY_VAR}={name!r} is not a discovery; known: auto, nvml, sim")


__all__ = ["Discovery", "DiscoveryError", "NvmlUnavailable", "discover_nvml", "discover_sim", "discovery_from_env"]
