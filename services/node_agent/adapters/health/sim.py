"""The simulated GPUs' health: a model per GPU (utilisation, memory, a temperature drifting between 35 and 70 °C,
power, SM clock and tensor activity following the load) and the faults a provider injects
(``node_agent.inject_fault``), which hold until cleared. The sim platform's stand-in for NVML, and the one probe
that accepts injected faults.

Thread-safe: the heartbeat loop samples in a thread while a command injects on the event loop.
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ...domain.health import GpuHealthProbe, GpuSample, XidEvent

GPU_FAULTS = ("xid", "ecc_dbe", "retired_pages", "temperature", "power", "nvlink")


class FaultError(ValueError):
    """An injected fault the model cannot apply (no such GPU, no XID code, no value)."""


@dataclass
class _Gpu:
    """One simulated GPU: its drifting model and the faults injected into it."""

    index: int
    pci: str
    memory_mib: float
    util: float = 0.0
    temp: float = 40.0
    faults: dict[str, tuple[float, datetime]] = field(default_factory=dict)   # kind -> (value, since)

    def drift(self, rng: random.Random) -> None:
        self.util = min(100.0, max(0.0, self.util + rng.uniform(-10, 10)))
        target = 35.0 + 0.35 * self.util          # 35 °C idle, 70 °C at full load
        self.temp = min(70.0, max(35.0, self.temp + 0.3 * (target - self.temp) + rng.uniform(-1, 1)))

    def sample(self) -> GpuSample:
        f = self.faults
        since = {"xid" if k == "xid" else _CONDITION[k]: s for k, (_, s) in f.items()}
        return GpuSample(
            gpu=self.index, pci=self.pci, uuid=f"GPU-sim-{self.pci}",
            util_pct=round(self.util, 1), fb_used_mib=round(self.memory_mib * self.util / 100, 1),
            temp_c=round(f["temperature"][0] if "temperature" in f else self.temp, 1),
            power_w=round(f["power"][0] if "power" in f else 70.0 + 6.3 * self.util, 1),
            xid=int(f["xid"][0]) if "xid" in f else 0,
            ecc_dbe=int(f["ecc_dbe"][0]) if "ecc_dbe" in f else 0, retired_pending="retired_pages" in f,
            nvlink_down="nvlink" in f, since=since,
            # an H100's SM clock: 345 MHz idle, boosting to 1980 MHz under full load; tensor cores busy for
            # most of a busy GPU's time (a training job's share), so the dashboards show plausible curves
            sm_clock_mhz=round(345.0 + 16.35 * self.util), tensor_active=round(0.85 * self.util / 100, 3))


_CONDITION = {"ecc_dbe": "ecc_dbe", "retired_pages": "retired_pages_pending", "temperature": "temperature",
              "power": "power", "nvlink": "nvlink"}


class SimHealthProbe(GpuHealthProbe):
    """GPUs modelled from the node's simulated topology (``gpus``: their PCI addresses and memory, in index
    order); ``seed`` makes the drift repeatable."""

    source = "sim"
    simulates = True

    def __init__(self, gpus: list[tuple[str, float]], seed: int | str = 0):
        self._rng = random.Random(seed)
        self._gpus = [_Gpu(i, pci, memory_mib) for i, (pci, memory_mib) in enumerate(gpus)]
        self._lock = threading.Lock()

    @classmethod
    def from_topology(cls, topology: dict, seed: int | str = 0) -> SimHealthProbe:
        """The GPUs of a topology document (``discovery``'s)."""
        return cls([(g["pci"], float(g.get("memory_gb", 0)) * 1024) for g in topology["gpus"]], seed)

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    def sample(self) -> list[GpuSample]:
        with self._lock:
            for gpu in self._gpus:
                gpu.drift(self._rng)
            return [gpu.sample() for gpu in self._gpus]

    def events(self, timeout_ms: int) -> list[XidEvent]:
        """Nothing: an injected XID shows in the samples from the moment it is injected."""
        return []

    def inject(self, kind: str, *, gpu: int | None = None, code: int | None = None, value: float | None = None,
               now: datetime | None = None) -> None:
        """Inject a GPU fault (``GPU_FAULTS``) into GPU ``gpu`` (default 0), or ``clear`` every fault; raises
        FaultError when it cannot apply. Injecting the same fault again keeps its start, with the new value."""
        now = now or datetime.now(UTC)
        with self._lock:
            if kind == "clear":
                for g in self._gpus:
                    g.faults.clear()
                return
            if kind not in GPU_FAULTS:
                raise FaultError(f"{kind!r} is not a GPU fault")
            index = 0 if gpu is None else gpu
            if not 0 <= index < len(self._gpus):
                raise FaultError(f"no GPU {index} on this node (it has {len(self._gpus)})")
            amount = self._amount(kind, code, value)
            faults = self._gpus[index].faults
            was = faults.get(kind)
            faults[kind] = (amount, was[1] if was and (kind != "xid" or was[0] == amount) else now)

    @staticmethod
    def _amount(kind: str, code: int | None, value: float | None) -> float:
        if kind == "xid":
            if code is None:
                raise FaultError("an XID fault needs its code")
            return float(code)
        if kind in ("temperature", "power"):
            if value is None:
                raise FaultError(f"a {kind} fault needs its value ({'°C' if kind == 'temperature' else 'W'})")
            return value
        return 1.0

