"""The sim discovery: realistic, deterministic topologies for the sim platform, tests and benchmarks.

The PCI bus numbers of GPUs, NVMe devices and ConnectX HCAs are those of the reference system, while the
PCI *domain* and the InfiniBand GUIDs are derived from the node name, so two nodes never share an address
or a GUID. Pure (no I/O), yet an adapter: the sim platform's stand-in for the hardware nvml reads.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from services.scheduler.contracts.topology import Gpu, IbVf, NodeTopology, NumaNode, Nvme, TopologyError

from .nvml import DiscoveryError


@dataclass(frozen=True)
class _Kind:
    model: str
    memory_gb: int
    mig_capable: bool
    gpu_bus: tuple[tuple[int, ...], ...]    # per NUMA node: PCI bus of each GPU
    nvme_bus: tuple[tuple[int, ...], ...]
    hca_bus: tuple[tuple[int, ...], ...]
    nvlink: tuple[tuple[int, ...], ...]     # per NUMA node: NVLink domain of each GPU
    cores_per_numa: int
    memory_per_numa_gb: int
    nvme_gb: int


SIM_KINDS: dict[str, _Kind] = {
    # DGX/HGX H100: 2 sockets x 56 cores (112 threads), 2 TiB; 8 GPUs on one NVSwitch fabric;
    # one ConnectX-7 per GPU; 8 U.2 NVMe.
    "hgx-h100-8": _Kind("H100", 80, True,
                        ((0x1b, 0x43, 0x52, 0x61), (0x9d, 0xc3, 0xd1, 0xdf)),
                        ((0x0c, 0x0d, 0x0e, 0x0f), (0x8c, 0x8d, 0x8e, 0x8f)),
                        ((0x18, 0x40, 0x4f, 0x5e), (0x9a, 0xc0, 0xce, 0xdc)),
                        ((0, 0, 0, 0), (0, 0, 0, 0)), 112, 1024, 3840),
    "hgx-a100-8": _Kind("A100", 80, True,
                        ((0x07, 0x0f, 0x47, 0x4e), (0x87, 0x90, 0xb7, 0xbd)),
                        ((0x22, 0x23, 0x24, 0x25), (0xa2, 0xa3, 0xa4, 0xa5)),
                        ((0x0c, 0x12, 0x4b, 0x54), (0x8d, 0x94, 0xba, 0xcc)),
                        ((0, 0, 0, 0), (0, 0, 0, 0)), 64, 1024, 3840),
    # DGX-2: 16 V100 32GB on one NVSwitch fabric, 2 sockets x 24 cores, 1.5 TiB; the 8 EDR HCAs are shared
    # by GPU pairs, so each slot's VF sits on its pair's HCA (bus) as function 1 or 2.
    "dgx2-v100-16": _Kind("V100", 32, False,
                          ((0x34, 0x36, 0x39, 0x3b, 0x57, 0x59, 0x5c, 0x5e),
                           (0xb7, 0xb9, 0xbc, 0xbe, 0xe0, 0xe2, 0xe5, 0xe7)),
                          ((0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d),
                           (0x86, 0x87, 0x88, 0x89, 0x8a, 0x8b, 0x8c, 0x8d)),
                          ((0x35, 0x35, 0x3a, 0x3a, 0x58, 0x58, 0x5d, 0x5d),
                           (0xb8, 0xb8, 0xbd, 0xbd, 0xe1, 0xe1, 0xe6, 0xe6)),
                          ((0,) * 8, (0,) * 8), 48, 768, 3840),
    # A 2-socket PCIe server with 4 L40S, bridged in pairs (two NVLink domains, one per socket).
    "pcie-l40s-4": _Kind("L40S", 48, False,
                         ((0x17, 0x31), (0xb1, 0xca)),
                         ((0x04, 0x05), (0x84, 0x85)),
                         ((0x1a, 0x33), (0xb3, 0xcc)),
                         ((0, 0), (1, 1)), 32, 512, 1920),
}


def _seed(node_name: str) -> bytes:
    return hashlib.sha256(node_name.encode()).digest()


def sim_topology(node_name: str, kind: str = "hgx-h100-8") -> NodeTopology:
    """The topology the sim discovery "finds" on ``node_name``; deterministic in the name.
    Raises TopologyError for an unknown kind (naming the known ones)."""
    spec = SIM_KINDS.get(kind)
    if spec is None:
        raise TopologyError(f"unknown sim topology kind {kind!r} (known: {', '.join(sorted(SIM_KINDS))})")
    seed = _seed(node_name)
    domain = f"{int.from_bytes(seed[:2], 'big') % 0x10000:04x}"
    guid_base = int.from_bytes(seed[2:10], "big") & 0xFFFFFFFFFFFFFF00
    gpus, nvmes, vfs, numa = [], [], [], []
    index = 0
    for nid, buses in enumerate(spec.gpu_bus):
        numa.append(NumaNode(nid, spec.cores_per_numa, spec.memory_per_numa_gb))
        for j, bus in enumerate(buses):
            gpus.append(Gpu(index, spec.model, f"{domain}:{bus:02x}:00.0", nid, spec.nvlink[nid][j],
                            spec.memory_gb, spec.mig_capable))
            nvmes.append(Nvme(index, f"{domain}:{spec.nvme_bus[nid][j]:02x}:00.0", nid, spec.nvme_gb))
            guid = guid_base | index
            fn = 1 + spec.hca_bus[nid][:j].count(spec.hca_bus[nid][j])   # the n-th VF of a shared HCA
            vfs.append(IbVf(index, f"{domain}:{spec.hca_bus[nid][j]:02x}:00.{fn}",
                            ":".join(f"{(guid >> s) & 0xFFFF:04x}" for s in (48, 32, 16, 0)),
                            nid, f"mlx5_{index}"))
            index += 1
    return NodeTopology(tuple(gpus), tuple(nvmes), tuple(vfs), tuple(numa))


def discover_sim(node_name: str, kind: str = "hgx-h100-8") -> dict:
    """The simulated topology document of ``node_name``; raises DiscoveryError for an unknown kind."""
    try:
        return sim_topology(node_name, kind).to_dict()
    except TopologyError as exc:
        raise DiscoveryError(f"TESSERA_SIM_TOPOLOGY: {exc}") from None
