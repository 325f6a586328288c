"""The real GPUs' health through NVML (nvidia-ml-py, imported only when the probe is built: the sim platform and
the tests never load it).

Each reading the GPU does not support (``NVMLError_NotSupported``: no ECC on a consumer card, no remapping before
Ampere) is skipped, never fatal. A critical XID comes as an NVML event; the probe keeps the last one per GPU as
DCGM does (DCGM_FI_DEV_XID_ERRORS), so its alert holds until the agent restarts (after the GPU's reset).
"""
from __future__ import annotations

import importlib
import threading
from datetime import UTC, datetime
from typing import Any

from ...domain.health import GpuHealthProbe, GpuSample, XidEvent


class NvmlProbe(GpuHealthProbe):
    """Reads every GPU NVML sees. Raises RuntimeError at construction when NVML cannot start here."""

    source = "nvml"

    def __init__(self, nvml: Any = None):
        try:
            self._nvml = nvml or importlib.import_module("pynvml")
            self._nvml.nvmlInit()
        except (ImportError, Exception) as exc:   # NVMLError (no driver) or no nvidia-ml-py
            raise RuntimeError(f"NVML cannot start on this host: {exc}") from None
        n = self._nvml
        self._handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
        self._xid: dict[int, tuple[int, datetime]] = {}
        self._lock = threading.Lock()
        self._events = n.nvmlEventSetCreate()
        for h in self._handles:
            self._optional(n.nvmlDeviceRegisterEvents, h, n.nvmlEventTypeXidCriticalError, self._events)

    def _optional(self, fn, *args, default=None):
        """``fn(*args)``, or ``default`` when the GPU does not support it."""
        try:
            return fn(*args)
        except self._nvml.NVMLError_NotSupported:
            return default

    def sample(self) -> list[GpuSample]:
        n, out = self._nvml, []
        for i, h in enumerate(self._handles):
            util = self._optional(n.nvmlDeviceGetUtilizationRates, h)
            memory = self._optional(n.nvmlDeviceGetMemoryInfo, h)
            power_mw = self._optional(n.nvmlDeviceGetPowerUsage, h, default=0)
            remapped = self._optional(n.nvmlDeviceGetRemappedRows, h)   # (correctable, uncorrectable, pending, failed)
            with self._lock:
                xid = self._xid.get(i)
            out.append(GpuSample(
                gpu=i, uuid=str(self._optional(n.nvmlDeviceGetUUID, h, default="")),
                pci=_pci(self._optional(n.nvmlDeviceGetPciInfo, h)),
                util_pct=float(util.gpu) if util is not None else 0.0,
                fb_used_mib=memory.used / 2**20 if memory is not None else 0.0,
                temp_c=float(self._optional(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU, default=0)),
                power_w=power_mw / 1000,
                xid=xid[0] if xid else 0,
                ecc_dbe=int(self._optional(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                           n.NVML_VOLATILE_ECC, default=0)),
                retired_pending=bool(self._optional(n.nvmlDeviceGetRetiredPagesPendingStatus, h, default=0)),
                remapped_pending=bool(remapped[2]) if remapped is not None else False,
                sm_clock_mhz=float(self._optional(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM, default=0)),
                since={"xid": xid[1]} if xid else {}))
        return out

    def events(self, timeout_ms: int) -> list[XidEvent]:
        """The XID errors of the next ``timeout_ms`` (the first, then any already waiting)."""
        n, found = self._nvml, []
        wait = timeout_ms
        while True:
            try:
                data = n.nvmlEventSetWait(self._events, wait)
            except n.NVMLError_Timeout:
                return found
            if data.eventType == n.nvmlEventTypeXidCriticalError:
                gpu = self._index_of(data.device)
                event = XidEvent(gpu, int(data.eventData), datetime.now(UTC))
                with self._lock:
                    self._xid[gpu] = (event.code, event.at)
                found.append(event)
            wait = 0

    def _index_of(self, handle: Any) -> int:
        uuid = self._nvml.nvmlDeviceGetUUID(handle)
        return next((i for i, h in enumerate(self._handles) if self._nvml.nvmlDeviceGetUUID(h) == uuid), 0)

    def close(self) -> None:
        if self._events is not None:
            self._events, events = None, self._events
            self._nvml.nvmlEventSetFree(events)
            self._nvml.nvmlShutdown()


def _pci(info: Any) -> str:
    """NVML's bus id ("00000000:1B:00.0") as the topology writes it ("0000:1b:00.0")."""
    if info is None:
        return ""
    bus = info.busId.decode() if isinstance(info.busId, bytes) else str(info.busId)
    domain, rest = bus.split(":", 1)
    return f"{domain[-4:]}:{rest}".lower()
