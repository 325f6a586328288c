"""The burn-in a node passes before it becomes schedulable (and when a provider admin re-runs it).

Checks, each named in the result:
  gpus_present    NVML sees every GPU the node is expected to have (TESSERA_BURN_IN_EXPECT_GPUS; unset: at least one)
  retired_pages   no GPU has retired pages pending (nvmlDeviceGetRetiredPagesPendingStatus)
  row_remap       no GPU reports a row-remapping failure (nvmlDeviceGetRemappedRows)
  xid             the driver's recovery action (NVML field 230) asks for nothing (no XID since boot that needs one)
  temperature     every GPU below TESSERA_BURN_IN_MAX_TEMP_C (default 85)
  nvme_read       the first MiB of every NVMe namespace reads back (the slots' disks)

TESSERA_BURN_IN picks the implementation: ``nvml`` (the checks above, on a GPU host), ``sim`` (the same check
names, all passing unless TESSERA_SIM_BURN_IN="fail:<check>[:<detail>]"), or ``auto`` (default: nvml when NVML
loads, else sim — as node discovery does). The checks are blocking; the handler runs them in a thread.
"""
from __future__ import annotations

import glob
import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..domain.model import Check
from ..domain.ports import BurnIn

CHECKS = ("gpus_present", "retired_pages", "row_remap", "xid", "temperature", "nvme_read")
XID_RECOVERY_FIELD = 230   # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h); 0 = none


class BurnInConfigError(ValueError):
    pass


@dataclass(frozen=True)
class SimBurnIn(BurnIn):
    """Every check passes, except the one TESSERA_SIM_BURN_IN names to fail."""

    fail: str | None = None
    detail: str = "injected failure (TESSERA_SIM_BURN_IN)"
    name: str = "sim"

    def run(self) -> list[Check]:
        return [Check(c, c != self.fail, self.detail if c == self.fail else "simulated") for c in CHECKS]


@dataclass(frozen=True)
class NvmlBurnIn(BurnIn):
    expect_gpus: int | None = None
    max_temp_c: int = 85
    nvme_glob: str = "/dev/nvme*n*"
    name: str = "nvml"

    def run(self) -> list[Check]:
        try:
            nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
        except Exception as exc:   # no library, no driver: every GPU check fails, named
            return [Check(c, False, f"NVML unavailable: {exc}") for c in CHECKS[:5]] + [self._nvme()]
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            want = self.expect_gpus or 1
            checks = [Check("gpus_present", len(handles) >= want, f"{len(handles)} GPU(s), expected {want}")]
            checks.append(self._each(handles, "retired_pages", lambda h: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 0,
                                     "retired pages pending"))
            checks.append(self._each(handles, "row_remap", lambda h: not nvml.nvmlDeviceGetRemappedRows(h)[3],
                                     "row remapping failed"))
            checks.append(self._each(handles, "xid", lambda h: _recovery_action(nvml, h) == 0,
                                     "the driver asks for a recovery action"))
            checks.append(self._each(handles, "temperature",
                                     lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU) < self.max_temp_c,
                                     f"at or above {self.max_temp_c} C"))
        finally:
            nvml.nvmlShutdown()
        return checks + [self._nvme()]

    @staticmethod
    def _each(handles, name: str, good, bad: str) -> Check:
        failed = []
        for i, h in enumerate(handles):
            try:
                if not good(h):
                    failed.append(f"GPU {i}: {bad}")
            except Exception as exc:   # NotSupported on this GPU: not a failure of the GPU
                if type(exc).__name__ != "NVMLError_NotSupported":
                    failed.append(f"GPU {i}: {exc}")
        return Check(name, not failed, "; ".join(failed) or "ok")

    def _nvme(self) -> Check:
        failed, devices = [], sorted(glob.glob(self.nvme_glob))
        for dev in devices:
            try:
                with open(dev, "rb", buffering=0) as f:
                    if len(f.read(1 << 20)) != 1 << 20:
                        failed.append(f"{dev}: short read")
            except OSError as exc:
                failed.append(f"{dev}: {exc.strerror}")
        return Check("nvme_read", not failed, "; ".join(failed) or f"{len(devices)} namespace(s) read")


def _recovery_action(nvml, handle) -> int:
    [value] = nvml.nvmlDeviceGetFieldValues(handle, [XID_RECOVERY_FIELD])
    return int(value.value.uiVal) if value.nvmlReturn == 0 else 0


def _nvml_loads() -> bool:
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:
        return False
    nvml.nvmlShutdown()
    return True


@dataclass(frozen=True)
class AutoBurnIn(BurnIn):
    """NVML's checks when NVML loads on this host, else the sim's; decided when a burn-in runs, not at start (the
    bootstrap touches no hardware)."""

    nvml: NvmlBurnIn
    sim: SimBurnIn
    name: str = "auto"

    def run(self) -> list[Check]:
        return (self.nvml if _nvml_loads() else self.sim).run()


def burn_in_from_env(environ: Mapping[str, str] | None = None) -> BurnIn:
    environ = os.environ if environ is None else environ
    kind = (environ.get("TESSERA_BURN_IN") or "auto").strip()
    sim = (environ.get("TESSERA_SIM_BURN_IN") or "pass").strip()
    if sim != "pass" and not (sim.startswith("fail:") and sim.split(":")[1] in CHECKS):
        raise BurnInConfigError(f"TESSERA_SIM_BURN_IN={sim!r}: expected 'pass' or 'fail:<check>[:<detail>]' "
                                f"with a check of {', '.join(CHECKS)}")
    parts = sim.split(":", 2)
    sim_checker = SimBurnIn(parts[1], parts[2]) if len(parts) == 3 else SimBurnIn(parts[1] if len(parts) > 1 else None)
    try:
        expect = int(environ["TESSERA_BURN_IN_EXPECT_GPUS"]) if environ.get("TESSERA_BURN_IN_EXPECT_GPUS") else None
        max_temp = int(environ.get("TESSERA_BURN_IN_MAX_TEMP_C") or 85)
    except ValueError:
        raise BurnInConfigError("TESSERA_BURN_IN_EXPECT_GPUS and TESSERA_BURN_IN_MAX_TEMP_C are integers") from None
    if kind == "sim":
        return sim_checker
    if kind == "nvml":
        return NvmlBurnIn(expect, max_temp)
    if kind == "auto":
        return AutoBurnIn(NvmlBurnIn(expect, max_temp), sim_checker)
    raise BurnInConfigError(f"TESSERA_BURN_IN={kind!r}: expected sim, nvml or auto")
