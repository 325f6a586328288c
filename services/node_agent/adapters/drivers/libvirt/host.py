"""Host facts the libvirt driver places a domain by: each NUMA node's CPUs and free 1 GiB huge pages.

Read from sysfs (blocking, a few small files: call off the event loop); ``sys_root`` is a parameter so
tests point it at a fake tree. ``sim_numa_cpus`` gives a sim topology's NUMA nodes made-up CPU ids, for
building a sim node's domains exactly as a real one's.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

_NODE_DIR = re.compile(r"node(\d+)")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """The CPUs of a kernel cpulist ("0-3,8-11", "" for none), sorted. Raises ValueError when malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None or (m[2] is not None and int(m[2]) < int(m[1])):
            raise ValueError(f"malformed cpulist {text.strip()!r}")
        cpus.update(range(int(m[1]), int(m[2] or m[1]) + 1))
    return tuple(sorted(cpus))


def numa_cpus(sys_root: Path = Path("/sys")) -> dict[int, tuple[int, ...]]:
    """NUMA node id -> its online CPUs, sorted (from ``devices/system/node/node*/cpulist``). A kernel
    without NUMA support has no such directory: then every online CPU is on node 0. Raises OSError when
    sysfs cannot be read, ValueError when a cpulist is malformed."""
    nodes = sys_root / "devices/system/node"
    if not nodes.is_dir():
        return {0: parse_cpulist((sys_root / "devices/system/cpu/online").read_text())}
    out = {}
    for d in nodes.iterdir():
        m = _NODE_DIR.fullmatch(d.name)
        if m is not None:
            out[int(m[1])] = parse_cpulist((d / "cpulist").read_text())
    return dict(sorted(out.items()))


def hugepages_1g(sys_root: Path = Path("/sys"), numa: int = 0) -> int:
    """The free 1 GiB huge pages on NUMA node ``numa`` (``free_hugepages``, not ``nr_hugepages``: pages
    already backing running domains are reserved, not free); 0 when the node has no 1 GiB pool."""
    pool = sys_root / f"devices/system/node/node{numa}/hugepages/hugepages-1048576kB/free_hugepages"
    try:
        return int(pool.read_text())
    except FileNotFoundError:
        return 0


def sim_numa_cpus(numa_nodes: Sequence) -> dict[int, tuple[int, ...]]:
    """Made-up CPU ids for a sim topology's NUMA nodes (anything with ``id`` and ``cpu_cores``): numbered
    consecutively in node order, so with equal nodes node n has ``n*cores .. (n+1)*cores-1``."""
    out, first = {}, 0
    for node in sorted(numa_nodes, key=lambda n: n.id):
        out[node.id] = tuple(range(first, first + node.cpu_cores))
        first += node.cpu_cores
    return out
