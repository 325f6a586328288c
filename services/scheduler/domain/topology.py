"""The slot map derived from a node's hardware topology, and re-discovery comparison (pure, no I/O).

A *slot* is the atomic unit of placement: one GPU together with one NVMe device and one
InfiniBand SR-IOV VF on the same NUMA node, plus an even share of that NUMA node's CPU cores
and memory. Slot ``i`` is GPU ``i``. A slot is schedulable only with a non-empty wipe policy
(release wipes the slot before it returns to the pool; no policy, no reuse). The hardware
model itself (``NodeTopology`` and its devices) is the scheduler's wire document (``contracts.topology``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..contracts.topology import (
    Gpu,
    IbVf,
    NodeTopology,
    NumaNode,
    Nvme,
    TopologyError,
    parse_record,
    require_unique,
)

# the hardware model is the scheduler's wire document, filled by the node-agent's discovery
__all__ = [
    "DEFAULT_WIPE_POLICY",
    "Gpu",
    "IbVf",
    "NodeTopology",
    "NumaNode",
    "Nvme",
    "SlotDef",
    "SlotMap",
    "TopologyError",
    "compare",
    "derive_slot_map",
]

DEFAULT_WIPE_POLICY = "nvme-secure-erase"


@dataclass(frozen=True)
class SlotDef:
    index: int
    gpu_index: int
    gpu_pci: str
    gpu_model: str
    nvme_pci: str
    ib_vf_pci: str
    ib_guid: str
    numa: int
    nvlink_domain: int
    cpu_cores: int
    memory_gb: int
    mig_capable: bool
    wipe_policy: str | None
    gpu_memory_gb: int = 0      # 0 = unknown (MIG profiles then fit by capability alone)


@dataclass(frozen=True)
class SlotMap:
    slots: tuple[SlotDef, ...]

    def __post_init__(self) -> None:
        require_unique(self.slots, "index", "slot")
        require_unique(self.slots, "gpu_pci", "slot")

    @property
    def schedulable_slots(self) -> tuple[SlotDef, ...]:
        """Slots with a non-empty wipe policy: the only ones placement may use."""
        return tuple(s for s in self.slots if s.wipe_policy)

    def to_dict(self) -> dict:
        return {"slots": [asdict(s) for s in self.slots]}

    @classmethod
    def from_dict(cls, d: Any) -> SlotMap:
        """Parse ``to_dict``'s output; raises TopologyError naming the first bad field."""
        if not isinstance(d, dict) or not isinstance(d.get("slots"), list):
            raise TopologyError("slot map: expected an object with a list 'slots'")
        slots = [parse_record(SlotDef, raw, f"slot_map.slots[{i}]") for i, raw in enumerate(d["slots"])]
        for i, s in enumerate(slots):
            if s.wipe_policy is not None and not isinstance(s.wipe_policy, str):
                raise TopologyError(f"slot_map.slots[{i}].wipe_policy: expected a string or null")
        return cls(tuple(slots))


def derive_slot_map(t: NodeTopology, wipe_policy: str | None = DEFAULT_WIPE_POLICY) -> tuple[SlotMap, list[str]]:
    """The proposed slot map of ``t`` and the problems found (GPUs left without a slot).

    On each NUMA node, GPUs, NVMe devices and VFs are each sorted by index and paired in
    order; a GPU without a partner NVMe or VF on its NUMA node gets no slot. CPU cores and
    memory of a NUMA node are split evenly (rounded down) among its GPUs that got a slot.
    """
    slots, problems = [], []
    numa = {n.id: n for n in t.numa_nodes}
    for nid in sorted(numa):
        gpus = sorted((g for g in t.gpus if g.numa == nid), key=lambda g: g.index)
        nvmes = sorted((n for n in t.nvmes if n.numa == nid), key=lambda n: n.index)
        vfs = sorted((v for v in t.ib_vfs if v.numa == nid), key=lambda v: v.index)
        paired = min(len(gpus), len(nvmes), len(vfs))
        for g in gpus[paired:]:
            lack = [name for name, have in (("NVMe", len(nvmes)), ("IB VF", len(vfs))) if have < len(gpus)]
            problems.append(f"GPU {g.index} ({g.pci}) on NUMA node {nid} has no free {' and '.join(lack)} "
                            f"on its NUMA node: no slot")
        if not paired:
            continue
        cores, mem = numa[nid].cpu_cores // paired, numa[nid].memory_gb // paired
        for g, n, v in zip(gpus, nvmes, vfs):
            slots.append(SlotDef(g.index, g.index, g.pci, g.model, n.pci, v.pci, v.guid, nid, g.nvlink_domain,
                                 cores, mem, g.mig_capable, wipe_policy, g.memory_gb))
    return SlotMap(tuple(sorted(slots, key=lambda s: s.index))), problems


def compare(approved: SlotMap, discovered: NodeTopology) -> list[str]:
    """Differences between an approved slot map and a re-discovered topology, one line each
    (a GPU, NVMe or VF missing, moved to another NUMA node / NVLink domain / index, or new).
    An empty list means the node still matches its approved map."""
    gpus = {g.pci: g for g in discovered.gpus}
    nvmes = {n.pci: n for n in discovered.nvmes}
    vfs = {v.pci: v for v in discovered.ib_vfs}
    out = []
    for s in approved.slots:
        g = gpus.get(s.gpu_pci)
        if g is None:
            out.append(f"slot {s.index}: GPU {s.gpu_pci} missing")
        else:
            for what, was, now in (("index", s.gpu_index, g.index), ("NUMA node", s.numa, g.numa),
                                   ("NVLink domain", s.nvlink_domain, g.nvlink_domain), ("model", s.gpu_model, g.model)):
                if was != now:
                    out.append(f"slot {s.index}: GPU {s.gpu_pci} {what} changed from {was} to {now}")
        n = nvmes.get(s.nvme_pci)
        if n is None:
            out.append(f"slot {s.index}: NVMe {s.nvme_pci} missing")
        elif n.numa != s.numa:
            out.append(f"slot {s.index}: NVMe {s.nvme_pci} moved from NUMA node {s.numa} to {n.numa}")
        v = vfs.get(s.ib_vf_pci)
        if v is None:
            out.append(f"slot {s.index}: IB VF {s.ib_vf_pci} missing")
        elif v.numa != s.numa or v.guid != s.ib_guid:
            out.append(f"slot {s.index}: IB VF {s.ib_vf_pci} changed (NUMA {s.numa}->{v.numa}, "
                       f"GUID {s.ib_guid}->{v.guid})")
    known = {s.gpu_pci for s in approved.slots}
    out.extend(f"GPU {g.pci} (index {g.index}) is new: not in the approved slot map"
               for g in discovered.gpus if g.pci not in known)
    return out
