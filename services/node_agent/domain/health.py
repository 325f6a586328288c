"""The node's GPU health, stated without any hardware (pure, no I/O): what a probe reads per GPU, the port that
reads it (``adapters.health``: NVML on a real node, a model on a simulated one), and the findings a sample
means, with the book that keeps each finding's start while it holds.

A finding is an alert before it goes on the wire (``contracts.Alert``): it names its target ("node", "gpu:<k>")
and its condition ("xid:<n>", "ecc_dbe", ...), and says what happened for the provider and what it means for a
tenant. The agent classifies nothing: the scheduler's policy does.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Limits:
    """Above these a GPU is too hot or draws too much power."""

    temperature_c: float = 90.0
    power_w: float = 700.0


@dataclass(frozen=True)
class GpuSample:
    """One GPU as a probe read it (the DCGM fields of ``contracts.GpuMetrics``, plus what only alerts need)."""

    gpu: int
    util_pct: float
    fb_used_mib: float
    temp_c: float
    power_w: float
    uuid: str = ""
    pci: str = ""                    # its PCI address ("dddd:bb:dd.f"), which names it in the slot map
    xid: int = 0                     # the last critical XID seen (0: none)
    ecc_dbe: int = 0                 # volatile double-bit ECC errors
    retired_pending: bool = False    # pages wait to be retired (a GPU reset retires them)
    remapped_pending: bool = False   # rows wait to be remapped (likewise)
    nvlink_down: bool = False
    sm_clock_mhz: float = 0.0        # DCGM_FI_DEV_SM_CLOCK (only /metrics shows it, not the heartbeat)
    tensor_active: float | None = None   # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, 0..1 (NVML cannot read it: None)
    # when each fault began, by condition, where the probe knows (the sim does; NVML does not)
    since: dict[str, datetime] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class XidEvent:
    """A critical XID error NVML reported for a GPU."""

    gpu: int
    code: int
    at: datetime


class GpuHealthProbe(abc.ABC):
    """Reads the node's GPUs. ``source`` names it in alerts ("nvml", "sim"); ``simulates``: faults may be injected."""

    source: str
    simulates: bool = False

    @abc.abstractmethod
    def sample(self) -> list[GpuSample]:
        """Every GPU's sample, in index order (blocking: the caller runs it in a thread)."""

    @abc.abstractmethod
    def events(self, timeout_ms: int) -> list[XidEvent]:
        """The XID errors reported within ``timeout_ms`` (blocking, like NVML's event wait; [] when none)."""

    def close(self) -> None:
        """Release what the probe holds (NVML's handle); idempotent."""


@dataclass(frozen=True)
class Finding:
    """A condition that holds now: the alert it becomes, without its source and start."""

    target: str
    condition: str
    message: str
    tenant_message: str
    since: datetime | None = None    # when the probe knows it; otherwise the book's first sight of it


GPU_TENANT = "A GPU of this allocation reported a hardware fault; the provider is looking into it."


def findings(sample: GpuSample, limits: Limits) -> list[Finding]:
    """What ``sample`` means: one finding per condition of the GPU that holds."""
    target, out = f"gpu:{sample.gpu}", []

    def add(condition: str, message: str, tenant: str = GPU_TENANT) -> None:
        key = condition.split(":", 1)[0]
        out.append(Finding(target, condition, message, tenant, sample.since.get(key)))

    if sample.xid:
        add(f"xid:{sample.xid}", f"GPU {sample.gpu} reported XID {sample.xid}")
    if sample.ecc_dbe:
        add("ecc_dbe", f"GPU {sample.gpu}: {sample.ecc_dbe} uncorrectable (double-bit) ECC error(s)")
    if sample.retired_pending:
        add("retired_pages_pending", f"GPU {sample.gpu}: memory pages wait to be retired (needs a GPU reset)")
    if sample.remapped_pending:
        add("remapped_rows_pending", f"GPU {sample.gpu}: memory rows wait to be remapped (needs a GPU reset)")
    if sample.nvlink_down:
        add("nvlink", f"GPU {sample.gpu}: an NVLink is down",
            "A GPU of this allocation lost an NVLink; multi-GPU work may be slow or fail.")
    if sample.temp_c > limits.temperature_c:
        add("temperature", f"GPU {sample.gpu} at {sample.temp_c:.0f} °C, over {limits.temperature_c:.0f} °C",
            "A GPU of this allocation runs too hot; it may slow down.")
    if sample.power_w > limits.power_w:
        add("power", f"GPU {sample.gpu} draws {sample.power_w:.0f} W, over {limits.power_w:.0f} W",
            "A GPU of this allocation draws too much power; it may slow down.")
    return out


class AlertBook:
    """The node's current findings, each with the time it began: a finding seen again keeps its start, one not
    seen any more is dropped (its fault cleared). Not thread-safe: the heartbeat loop alone uses it."""

    def __init__(self) -> None:
        self._since: dict[tuple[str, str], datetime] = {}

    def current(self, found: list[Finding], now: datetime) -> list[tuple[Finding, datetime]]:
        """``found`` (what holds now), each with its start; forgets what no longer holds."""
        keys = {(f.target, f.condition) for f in found}
        self._since = {k: v for k, v in self._since.items() if k in keys}
        out = []
        for f in found:
            since = self._since.setdefault((f.target, f.condition), f.since or now)
            out.append((f, since))
        return out


@dataclass
class AgentFaults:
    """The injected faults that act on the agent itself, not on a GPU: a silence (heartbeat_loss, for a while or
    until cleared), a delay before every heartbeat and command (slow_agent), and a node that is down (node_down:
    silent until cleared)."""

    silent_until: datetime | None = None
    silent_until_cleared: bool = False
    node_down: bool = False
    slow_s: float = 0.0
    slow_since: datetime | None = None

    def silent(self, now: datetime) -> bool:
        """Whether the agent sends no heartbeat now."""
        return self.node_down or self.silent_until_cleared or (self.silent_until is not None and now < self.silent_until)

    def findings(self) -> list[Finding]:
        """What the agent reports about itself (a slow agent; a silent one reports nothing, being silent)."""
        if not self.slow_s:
            return []
        return [Finding("node", "agent_slow", f"the node-agent delays every heartbeat and command by {self.slow_s:g} s",
                        "The node this allocation runs on answers slowly.", self.slow_since)]

    def clear(self) -> None:
        self.silent_until, self.silent_until_cleared, self.node_down = None, False, False
        self.slow_s, self.slow_since = 0.0, None
