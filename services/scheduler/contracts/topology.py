"""Node hardware topology: the document a node-agent's discovery reports and the scheduler turns into a slot map.

A node has GPUs, NVMe devices, InfiniBand SR-IOV VFs and NUMA nodes. Topologies are
validated when built (``NodeTopology(...)`` or ``from_dict``): every device names an
existing NUMA node, indices and PCI addresses are unique. Errors raise
``TopologyError`` (a ``ValueError``) naming the offending device, and nothing is built.

The scheduler owns this document (it is the payload of ``scheduler.report_topology``); the node-agent's
discovery fills it. Pure: no I/O.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any


class TopologyError(ValueError):
    """A topology or slot map document is malformed or inconsistent."""


@dataclass(frozen=True)
class Gpu:
    index: int
    model: str
    pci: str
    numa: int
    nvlink_domain: int
    memory_gb: int
    mig_capable: bool = False


@dataclass(frozen=True)
class Nvme:
    index: int
    pci: str
    numa: int
    size_gb: int


@dataclass(frozen=True)
class IbVf:
    index: int
    pci: str
    guid: str
    numa: int
    hca: str


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpu_cores: int
    memory_gb: int


def parse_record(cls, raw: Any, where: str):
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: expected an object, got {type(raw).__name__}")
    fields = cls.__dataclass_fields__
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise TopologyError(f"{where}: unknown field(s) {', '.join(unknown)}")
    try:
        obj = cls(**raw)
    except TypeError as exc:   # a required field is missing
        raise TopologyError(f"{where}: {exc}") from None
    for name, f in fields.items():
        value = getattr(obj, name)
        want = {"int": int, "str": str, "bool": bool}.get(str(f.type))
        bad_int = want is int and (isinstance(value, bool) or not isinstance(value, int))
        if want is not None and (bad_int or not isinstance(value, want)):
            raise TopologyError(f"{where}.{name}: expected {want.__name__}, got {value!r}")
        if want is int and value < 0:
            raise TopologyError(f"{where}.{name}: must not be negative, got {value}")
    return obj


def require_unique(items, attr: str, kind: str) -> None:
    dup = [v for v, n in Counter(getattr(i, attr) for i in items).items() if n > 1]
    if dup:
        raise TopologyError(f"duplicate {kind} {attr} {dup[0]!r}")


@dataclass(frozen=True)
class NodeTopology:
    gpus: tuple[Gpu, ...]
    nvmes: tuple[Nvme, ...]
    ib_vfs: tuple[IbVf, ...]
    numa_nodes: tuple[NumaNode, ...]

    def __post_init__(self) -> None:
        require_unique(self.numa_nodes, "id", "NUMA node")
        numa = {n.id for n in self.numa_nodes}
        for kind, items in (("GPU", self.gpus), ("NVMe", self.nvmes), ("IB VF", self.ib_vfs)):
            require_unique(items, "index", kind)
            require_unique(items, "pci", kind)
            for item in items:
                if item.numa not in numa:
                    raise TopologyError(f"{kind} {item.index} ({item.pci}) is on NUMA node {item.numa}, "
                                        f"which the topology does not list (known: {sorted(numa)})")

    def to_dict(self) -> dict:
        return {"gpus": [asdict(g) for g in self.gpus], "nvmes": [asdict(n) for n in self.nvmes],
                "ib_vfs": [asdict(v) for v in self.ib_vfs], "numa_nodes": [asdict(n) for n in self.numa_nodes]}

    @classmethod
    def from_dict(cls, d: Any) -> NodeTopology:
        """Parse ``to_dict``'s output; raises TopologyError naming the first bad field."""
        if not isinstance(d, dict):
            raise TopologyError(f"topology: expected an object, got {type(d).__name__}")
        parts = {}
        for key, item_cls in (("gpus", Gpu), ("nvmes", Nvme), ("ib_vfs", IbVf), ("numa_nodes", NumaNode)):
            raw = d.get(key)
            if not isinstance(raw, list):
                raise TopologyError(f"topology.{key}: expected a list, got {type(raw).__name__}")
            parts[key] = tuple(parse_record(item_cls, r, f"topology.{key}[{i}]") for i, r in enumerate(raw))
        unknown = sorted(set(d) - set(parts))
        if unknown:
            raise TopologyError(f"topology: unknown field(s) {', '.join(unknown)}")
        return cls(**parts)
