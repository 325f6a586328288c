"""The sim discovery: a realistic, deterministic topology per node name (see shared.topology)."""
from __future__ import annotations

from shared.topology import TopologyError, sim_topology

from .nvml import DiscoveryError


def discover_sim(node_name: str, kind: str = "hgx-h100-8") -> dict:
    """The simulated topology document of ``node_name``; raises DiscoveryError for an unknown kind."""
    try:
        return sim_topology(node_name, kind).to_dict()
    except TopologyError as exc:
        raise DiscoveryError(f"TESSERA_SIM_TOPOLOGY: {exc}") from None
