"""Real discovery: GPUs through NVML (nvidia-ml-py), NUMA, NVMe and InfiniBand VFs from sysfs.

NVLink domains: GPUs joined by an active NVLink (directly or through an NVSwitch)
share a domain; a GPU without an active link is a domain of its own. A GPU's NUMA
node is its PCI device's ``numa_node`` (-1, "no affinity", counts as node 0).
Only SR-IOV *virtual* functions of InfiniBand devices are listed as IB VFs: a
slot's VF is what gets passed through to a VM.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any


class DiscoveryError(RuntimeError):
    """Discovery could not describe this node; the message says what to fix."""


class NvmlUnavailable(DiscoveryError):
    """NVML cannot be used on this host (no driver, no library, no GPU)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pci(bus_id: Any) -> str:
    """NVML's '00000000:1B:00.0' as sysfs names it: '0000:1b:00.0'."""
    raw = _text(bus_id).lower()
    domain, rest = raw.split(":", 1)
    return f"{int(domain, 16) & 0xFFFF:04x}:{rest}"


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def _numa_of(sysfs: Path, pci: str) -> int:
    value = int(_read(sysfs / "bus/pci/devices" / pci / "numa_node", "-1") or -1)
    return max(value, 0)


def _model(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'."""
    for token in name.replace("NVIDIA", "").split():
        if re.match(r"^[A-Z]+\d+[A-Z]*$", token):
            return token
    return name.strip() or "unknown"


def _nvlink_domains(nvml, handles: list, pcis: list[str]) -> list[int]:
    parent = list(range(len(handles) + 1))          # the last element stands for "an NVSwitch"

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    for i, h in enumerate(handles):
        for link in range(links):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(h, link):
                    continue
                remote = _pci(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
            except nvml.NVMLError:
                break
            j = pcis.index(remote) if remote in pcis else len(handles)
            parent[find(i)] = find(j)
    roots = [find(i) for i in range(len(handles))]
    order = {r: n for n, r in enumerate(dict.fromkeys(roots))}
    return [order[r] for r in roots]


def _gpus(nvml, sysfs: Path) -> list[dict]:
    count = nvml.nvmlDeviceGetCount()
    if count == 0:
        raise NvmlUnavailable("NVML works but reports no GPU on this host")
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    pcis = [_pci(nvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
    domains = _nvlink_domains(nvml, handles, pcis)
    out = []
    for i, h in enumerate(handles):
        try:
            nvml.nvmlDeviceGetMigMode(h)
            mig = True
        except nvml.NVMLError:
            mig = False
        out.append({"index": i, "model": _model(_text(nvml.nvmlDeviceGetName(h))), "pci": pcis[i],
                    "numa": _numa_of(sysfs, pcis[i]), "nvlink_domain": domains[i],
                    "memory_gb": nvml.nvmlDeviceGetMemoryInfo(h).total // 2**30, "mig_capable": mig})
    return out


def _nvmes(sysfs: Path) -> list[dict]:
    out = []
    for ctrl in sorted((sysfs / "class/nvme").glob("nvme*")):
        pci = (ctrl / "device").resolve().name
        sectors = sum(int(_read(ns / "size", "0") or 0) for ns in ctrl.glob(f"{ctrl.name}n*"))
        out.append({"index": len(out), "pci": pci, "numa": _numa_of(sysfs, pci), "size_gb": sectors * 512 // 10**9})
    return out


def _ib_vfs(sysfs: Path) -> list[dict]:
    out = []
    for dev in sorted((sysfs / "class/infiniband").glob("*")):
        if not (dev / "device/physfn").exists():     # a physical function: not passed through
            continue
        pci = (dev / "device").resolve().name
        out.append({"index": len(out), "pci": pci, "guid": _read(dev / "node_guid"), "numa": _numa_of(sysfs, pci),
                    "hca": (dev / "device/physfn").resolve().name})
    return out


def _cpus(cpulist: str) -> int:
    total = 0
    for part in filter(None, cpulist.split(",")):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


def _numa_nodes(sysfs: Path) -> list[dict]:
    out = []
    for node in sorted((sysfs / "devices/system/node").glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        kb = re.search(r"MemTotal:\s+(\d+)", _read(node / "meminfo"))
        out.append({"id": int(node.name[4:]), "cpu_cores": _cpus(_read(node / "cpulist")),
                    "memory_gb": int(kb.group(1)) // 2**20 if kb else 0})
    return out or [{"id": 0, "cpu_cores": 0, "memory_gb": 0}]


def discover_nvml(nvml: Any = None, sysfs: Path = Path("/sys")) -> dict:
    """This host's topology document. Raises NvmlUnavailable without a usable NVIDIA driver or GPU,
    DiscoveryError for anything else NVML refuses. ``nvml`` is the pynvml module (injectable for tests)."""
    try:
        nvml = nvml or importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from None
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML cannot start on this host: {exc} (is the NVIDIA driver installed?)") from None
    try:
        gpus = _gpus(nvml, sysfs)
    except nvml.NVMLError as exc:
        raise DiscoveryError(f"NVML refused to describe the GPUs: {exc}") from None
    finally:
        nvml.nvmlShutdown()
    return {"gpus": gpus, "nvmes": _nvmes(sysfs), "ib_vfs": _ib_vfs(sysfs), "numa_nodes": _numa_nodes(sysfs)}
