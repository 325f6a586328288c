"""The node's GPU health probes (``domain.health.GpuHealthProbe``), chosen by TESSERA_NODE_HEALTH_PROBE:
  sim   a model of the node's simulated GPUs that accepts injected faults (``sim``)
  nvml  the real GPUs through NVML (``nvml``; nvidia-ml-py is imported only then)
  none  no probe: heartbeats carry no GPUs and no GPU alerts
  auto  (default) sim when the driver's devices are simulated (the sim driver; libvirt without passthrough),
        otherwise none (the driver's GPUs are passed through to guests or belong to a bare-metal server)
"""
from __future__ import annotations

from collections.abc import Callable

from ...domain.health import GpuHealthProbe
from .nvml import NvmlProbe
from .sim import GPU_FAULTS, FaultError, SimHealthProbe

PROBES = ("auto", "sim", "nvml", "none")


def build_probe(name: str, *, devices_simulated: bool, topology: Callable[[], dict],
                seed: str = "") -> GpuHealthProbe | None:
    """The probe ``name`` names (None for none); ``topology``: the simulated topology a sim probe models.
    Raises RuntimeError when NVML cannot start."""
    if name == "auto":
        name = "sim" if devices_simulated else "none"
    if name == "sim":
        return SimHealthProbe.from_topology(topology(), seed)
    if name == "nvml":
        return NvmlProbe()
    return None


__all__ = ["GPU_FAULTS", "PROBES", "FaultError", "NvmlProbe", "SimHealthProbe", "build_probe"]
