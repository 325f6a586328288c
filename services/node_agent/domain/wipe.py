"""Wipe on release, the decisions: which erase a policy allows, which NVMe format level a controller
supports, what to read back to verify, and the evidence a wipe leaves. Pure: no I/O (the adapter
``services.node_agent.adapters.wipe`` runs the commands).

Follows Ironic's NVMe erase (``ironic_python_agent.hardware._nvme_erase``): ``nvme id-ctrl -o json``;
crypto erase (``-s 2``) when ``fna & 0b100``, else user-data erase (``-s 1``) when ``oacs & 0b10``;
``nvme format <dev> -s N -f``. The fallback is Ironic's ``erase_devices_metadata`` shape with a discard
first: ``blkdiscard``, ``wipefs --all --force`` and zeroing the first and last MiB.
"""
from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

MIB = 1 << 20
BLOCK = 4096

DEFAULT_POLICY = "nvme-secure-erase"

METHOD_CRYPTO = "nvme-format-crypto"
METHOD_USER_DATA = "nvme-format-user-data"
METHOD_DISCARD = "blkdiscard+wipefs"
METHOD_SIMULATED = "simulated"
METHOD_NONE = "none"          # the device failed before any erase ran (nothing was destroyed)
METHODS = (METHOD_CRYPTO, METHOD_USER_DATA, METHOD_DISCARD, METHOD_SIMULATED, METHOD_NONE)

GPU_RESET = "reset"
GPU_NO_DRIVER = "no-driver"
GPU_SIMULATED = "simulated"


class WipePolicyError(ValueError):
    """A wipe policy name this node agent does not know."""


@dataclass(frozen=True)
class WipePolicy:
    name: str
    nvme: bool        # try NVMe format (crypto, else user-data erase)
    fallback: bool    # blkdiscard + wipefs + zeroed ends where NVMe format is unavailable or fails


POLICIES = {
    "nvme-secure-erase": WipePolicy("nvme-secure-erase", nvme=True, fallback=False),
    "nvme-secure-erase+discard": WipePolicy("nvme-secure-erase+discard", nvme=True, fallback=True),
    "discard": WipePolicy("discard", nvme=False, fallback=True),
}


def parse_policy(name: str | None) -> WipePolicy:
    """The policy called ``name``; raises WipePolicyError (naming the known ones) for any other name."""
    policy = POLICIES.get((name or "").strip())
    if policy is None:
        raise WipePolicyError(f"unknown wipe policy {clip(repr(name), 100)}: known policies are {', '.join(sorted(POLICIES))}")
    return policy


def _flag(value: Any) -> int:
    """An ``id-ctrl`` field as an int: nvme-cli prints ints; some versions print hex strings."""
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            return 0
    return int(value) if isinstance(value, int) else 0


def nvme_format_level(id_ctrl: dict) -> int | None:
    """The ``nvme format -s`` level a controller supports: 2 (crypto erase, ``fna`` bit 2), 1 (user-data
    erase, ``oacs`` bit 1: Format NVM supported), or None (no format)."""
    if _flag(id_ctrl.get("fna")) & 0b100:
        return 2
    if _flag(id_ctrl.get("oacs")) & 0b10:
        return 1
    return None


def format_method(level: int) -> str:
    return METHOD_CRYPTO if level == 2 else METHOD_USER_DATA


# The command lines, as argv tuples; the adapter runs them and records ``command_line`` of each.
def size_argv(device: str) -> tuple[str, ...]:
    return ("blockdev", "--getsize64", device)


def id_ctrl_argv(device: str) -> tuple[str, ...]:
    return ("nvme", "id-ctrl", device, "-o", "json")


def nvme_format_argv(device: str, level: int) -> tuple[str, ...]:
    return ("nvme", "format", device, "-s", str(level), "-f")


def discard_argv(device: str) -> tuple[str, ...]:
    return ("blkdiscard", device)


def wipefs_argv(device: str) -> tuple[str, ...]:
    return ("wipefs", "--all", "--force", device)


def probe_argv(device: str) -> tuple[str, ...]:
    return ("wipefs", "--no-act", "--noheadings", device)


def gpu_reset_argv(gpu_pci: str) -> tuple[str, ...]:
    return ("nvidia-smi", "--gpu-reset", "-i", gpu_pci)


def command_line(argv: Iterable[str]) -> str:
    return shlex.join(argv)


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (evidence fields are bounded on the wire)."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def command_failure(argv: Iterable[str], rc: int | None, stderr: str) -> str:
    """A reason naming the failed command and what it said (its last non-empty stderr lines), under 450
    characters so that ``"failed: " + reason`` fits the wire's bound on a GPU reset."""
    said = " / ".join(line.strip() for line in stderr.strip().splitlines()[-3:] if line.strip())
    status = "timed out" if rc is None else f"exit {rc}"
    return f"`{clip(command_line(argv), 120)}` failed ({status}): {clip(said or 'no output', 300)}"


def end_ranges(size: int) -> tuple[tuple[int, int], ...]:
    """(offset, length) of the first and last MiB of a device of ``size`` bytes (one range when small)."""
    if size <= 2 * MIB:
        return ((0, size),) if size > 0 else ()
    return ((0, MIB), (size - MIB, MIB))


def verification_ranges(size: int, samples: int) -> tuple[tuple[int, int], ...]:
    """What verification reads back: the first and last MiB fully, plus ``samples`` 4 KiB blocks spread
    evenly (deterministically: the middle of each of ``samples`` equal strides) over the rest.
    Ranges are sorted and 4 KiB-aligned where the size allows; their total is O(1) in the device size."""
    ranges = list(end_ranges(size))
    if size > 2 * MIB and samples > 0:
        first, blocks = MIB // BLOCK, (size - 2 * MIB) // BLOCK
        picked = sorted({first + (2 * i + 1) * blocks // (2 * samples) for i in range(samples)} if blocks else set())
        ranges[1:1] = [(b * BLOCK, BLOCK) for b in picked]
    return tuple(ranges)


def first_nonzero(data: bytes | bytearray | memoryview) -> int | None:
    """Index of the first non-zero byte of ``data``, or None when it is all zero."""
    view = bytes(data)
    rest = view.lstrip(b"\0")
    return len(view) - len(rest) if rest else None


def signatures(wipefs_output: str) -> list[str]:
    """The signatures ``wipefs --no-act --noheadings`` lists (one per non-empty line); [] when none."""
    return [line.strip() for line in wipefs_output.splitlines() if line.strip()]


@dataclass(frozen=True)
class DeviceEvidence:
    device: str
    method: str                # one of METHODS
    bytes: int
    duration_s: float
    verified: bool
    verification: str
    ok: bool
    reason: str | None
    commands: tuple[str, ...]  # the command lines run, in order, for the record

    def to_dict(self) -> dict:
        return {"device": self.device, "method": self.method, "bytes": self.bytes, "duration_s": self.duration_s,
                "verified": self.verified, "verification": self.verification, "ok": self.ok, "reason": self.reason,
                "commands": list(self.commands)}


@dataclass(frozen=True)
class SlotEvidence:
    slot: int
    devices: tuple[DeviceEvidence, ...]
    gpu_reset: str             # "reset", "no-driver", "simulated" or "failed: <why>"
    ok: bool
    reason: str | None
    policy: str
    started_at: datetime
    finished_at: datetime
    duration_s: float
    agent_version: str

    def to_dict(self) -> dict:
        """JSON-ready: ISO 8601 times, lists for tuples."""
        return {"slot": self.slot, "devices": [d.to_dict() for d in self.devices], "gpu_reset": self.gpu_reset,
                "ok": self.ok, "reason": self.reason, "policy": self.policy,
                "started_at": self.started_at.isoformat(), "finished_at": self.finished_at.isoformat(),
                "duration_s": self.duration_s, "agent_version": self.agent_version}


def gpu_reset_failed(gpu_reset: str) -> bool:
    return gpu_reset.startswith("failed")


def slot_outcome(devices: Iterable[DeviceEvidence], gpu_reset: str) -> tuple[bool, str | None]:
    """A slot is wiped when it has devices, every one is ok, and its GPU reset did not fail; the reason
    is the first failure found (devices first)."""
    devices = tuple(devices)
    if not devices:
        return False, "no device was wiped"
    for d in devices:
        if not d.ok:
            return False, d.reason or f"{d.device}: wipe failed"
    if gpu_reset_failed(gpu_reset):
        return False, f"GPU reset {gpu_reset}"
    return True, None
