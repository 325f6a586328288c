"""Wipe on release, the I/O: erase a slot's NVMe namespace(s), reset its GPU, verify, and return evidence.

``Wiper.wipe_slot`` never raises for a wipe that fails: that is an outcome (``ok`` False, the reason naming
the failed command and what it said). External commands run as asyncio subprocesses, each with a timeout
(``TIMEOUT_S``), stdin closed and ``LC_ALL=C``. Nothing is erased on a device another holder has opened
exclusively (a mounted file system, a RAID member): the exclusive-open probe refuses it first.

Verification reads back the first and last MiB plus ``samples`` 4 KiB blocks (O_DIRECT where the device
allows, so the page cache cannot answer for the disk) and requires zeros, then requires ``wipefs`` to find
no signature. It never reads the whole device: its cost does not grow with the device's size.
"""
from __future__ import annotations

import asyncio
import errno
import importlib.metadata
import json
import mmap
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from services.node_agent.domain import wipe as plan
from services.node_agent.domain.ports import SlotWiper
from services.node_agent.domain.wipe import DeviceEvidence, SlotEvidence, WipePolicy, WipePolicyError

ENV_DEVICES = "TESSERA_WIPE_DEVICES"

# Seconds each command may run. A user-data NVMe format or a discard of a large, slow device can take
# many minutes; crypto erase and everything else takes seconds.
TIMEOUT_S = {"nvme format": 3600.0, "blkdiscard": 3600.0, "nvidia-smi": 300.0}
DEFAULT_TIMEOUT_S = 60.0

_NAMESPACE = re.compile(r"^nvme(\d+)(?:c\d+)?n(\d+)$")     # nvme0n1, or a multipath path node nvme0c1n1


def _package_version() -> str:
    """The installed package's version, else the source tree's (pyproject.toml), else "dev"."""
    try:
        return importlib.metadata.version("tessera")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        import tomllib
        with open(Path(__file__).resolve().parents[3] / "pyproject.toml", "rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, ValueError):
        return "dev"


AGENT_VERSION = _package_version()


class CommandFailed(Exception):
    """A wipe step failed; ``reason`` names the command and what it said."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Transcript:
    """One device's (or the GPU's) record: every command line run, in order, and the method attempted."""
    commands: list[str] = field(default_factory=list)
    method: str = plan.METHOD_NONE

    async def run(self, argv: Sequence[str]) -> str:
        """Run ``argv``; its stdout, or CommandFailed (non-zero exit, timeout, missing executable)."""
        self.commands.append(plan.command_line(argv))
        timeout = TIMEOUT_S.get(" ".join(argv[:2]), TIMEOUT_S.get(argv[0], DEFAULT_TIMEOUT_S))
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env={**os.environ, "LC_ALL": "C"})
        except OSError as e:
            raise CommandFailed(plan.command_failure(argv, 127, f"cannot run {argv[0]}: {e.strerror}")) from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            raise CommandFailed(plan.command_failure(argv, None, f"no exit after {timeout:g}s")) from None
        finally:
            if proc.returncode is None:          # timed out or cancelled: never leave a wipe running
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            raise CommandFailed(plan.command_failure(argv, proc.returncode, err.decode(errors="replace")))
        return out.decode(errors="replace")

    def note(self, line: str) -> None:
        self.commands.append(line)


class Wiper(SlotWiper):
    """Wipes slots on this node. ``device_map`` (slot -> block devices) overrides sysfs discovery;
    ``simulate`` runs nothing; ``samples`` is the number of 4 KiB blocks verified besides the ends."""

    def __init__(self, *, device_map: dict[int, list[str]] | None = None, simulate: bool = False, samples: int = 16,
                 agent_version: str = AGENT_VERSION, sysfs: str = "/sys"):
        if samples < 0:
            raise ValueError("samples must be >= 0")
        self.device_map = {int(k): list(v) for k, v in (device_map or {}).items()}
        self.simulate = simulate
        self.samples = samples
        self.agent_version = agent_version
        self.sysfs = Path(sysfs)

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, simulate: bool) -> Wiper:
        """A Wiper with ``TESSERA_WIPE_DEVICES`` (JSON: {"<slot>": ["/dev/...", ...]}) as its device map;
        raises ValueError naming the variable when it is malformed."""
        raw = (environ.get(ENV_DEVICES) or "").strip()
        return cls(device_map=parse_device_map(raw) if raw else None, simulate=simulate)

    def devices_for(self, slot: int, nvme_pci: str | None) -> list[str]:
        """The override map's devices for ``slot``; else the namespaces of the NVMe controller at
        ``nvme_pci`` (from sysfs, as /dev/nvmeXnY); else []."""
        if slot in self.device_map:
            return list(self.device_map[slot])
        if not nvme_pci:
            return []
        found = set()
        for ctrl in (self.sysfs / "bus/pci/devices" / nvme_pci / "nvme").glob("nvme*"):
            for ns in ctrl.glob("nvme*n*"):
                m = _NAMESPACE.match(ns.name)
                if m:
                    found.add((int(m[1]), int(m[2])))
        return [f"/dev/nvme{c}n{n}" for c, n in sorted(found)]

    async def wipe_slot(self, slot: int, *, nvme_pci: str | None, gpu_pci: str | None, policy: str) -> SlotEvidence:
        """Erase, verify and reset ``slot``; the evidence says whether it worked. Never raises for a wipe
        that fails. Devices are wiped concurrently, together with the GPU reset."""
        started, t0 = datetime.now(UTC), time.monotonic()

        def evidence(devices, gpu_reset: str, ok: bool, reason: str | None, name: str) -> SlotEvidence:
            return SlotEvidence(slot=slot, devices=tuple(devices), gpu_reset=gpu_reset, ok=ok, reason=reason,
                                policy=name, started_at=started, finished_at=datetime.now(UTC),
                                duration_s=time.monotonic() - t0, agent_version=self.agent_version)

        try:
            parsed = plan.parse_policy(policy)
        except WipePolicyError as e:
            return evidence((), "failed: not attempted", False, str(e), policy or "")
        if self.simulate:
            sim = DeviceEvidence(device="simulated", method=plan.METHOD_SIMULATED, bytes=0, duration_s=0.0, verified=True,
                                 verification="simulated", ok=True, reason=None, commands=())
            return evidence((sim,), plan.GPU_SIMULATED, True, None, parsed.name)
        devices = self.devices_for(slot, nvme_pci)
        if not devices:
            return evidence((), "failed: not attempted", False, f"no block device for slot {slot} (nvme {nvme_pci})",
                            parsed.name)
        *wiped, gpu_reset = await asyncio.gather(*(self._wipe_device(d, parsed) for d in devices), self._reset_gpu(gpu_pci))
        ok, reason = plan.slot_outcome(wiped, gpu_reset)
        return evidence(wiped, gpu_reset, ok, reason, parsed.name)

    async def _wipe_device(self, device: str, policy: WipePolicy) -> DeviceEvidence:
        record, t0 = _Transcript(), time.monotonic()
        size, verified, verification, reason = 0, False, "not verified", None
        try:
            await asyncio.to_thread(_refuse_if_in_use, device)
            size = int((await record.run(plan.size_argv(device))).strip())
            await self._erase(device, size, policy, record)
            verified, verification = await self._verify(device, size, record)
            if not verified:
                reason = f"{device}: verification after {record.method} failed: {verification}"
        except CommandFailed as e:
            reason = f"{device}: {e.reason}"
        except (OSError, ValueError) as e:
            reason = f"{device}: {e}"
        return DeviceEvidence(device=device, method=record.method, bytes=size, duration_s=time.monotonic() - t0,
                              verified=verified, verification=verification, ok=reason is None, reason=reason,
                              commands=tuple(record.commands))

    async def _erase(self, device: str, size: int, policy: WipePolicy, record: _Transcript) -> None:
        """NVMe format when the policy allows it and the controller supports it; else the fallback when the
        policy allows that; else CommandFailed saying why nothing was erased."""
        if policy.nvme:
            why = await self._nvme_format(device, record)
            if why is None:
                return
            if not policy.fallback:
                raise CommandFailed(f"NVMe format unavailable or failed, and policy {policy.name} allows no "
                                    f"fallback: {why}")
        record.method = plan.METHOD_DISCARD
        await record.run(plan.discard_argv(device))
        await record.run(plan.wipefs_argv(device))
        ranges = plan.end_ranges(size)
        record.note("zero " + ", ".join(f"{n}@{o}" for o, n in ranges) + f" of {device} (pwrite + fsync)")
        await asyncio.to_thread(_write_zeros, device, ranges)

    async def _nvme_format(self, device: str, record: _Transcript) -> str | None:
        """Format with the best level the controller offers; None when done, else why not."""
        try:
            id_ctrl = json.loads(await record.run(plan.id_ctrl_argv(device)))
        except CommandFailed as e:
            return f"not an NVMe controller: {e.reason}"
        except ValueError as e:
            return f"`nvme id-ctrl` printed no JSON: {e}"
        id_ctrl = id_ctrl if isinstance(id_ctrl, dict) else {}
        level = plan.nvme_format_level(id_ctrl)
        if level is None:
            return f"controller supports no format (oacs={id_ctrl.get('oacs')}, fna={id_ctrl.get('fna')})"
        record.method = plan.format_method(level)
        try:
            await record.run(plan.nvme_format_argv(device, level))
        except CommandFailed as e:
            return e.reason
        return None

    async def _verify(self, device: str, size: int, record: _Transcript) -> tuple[bool, str]:
        ranges = plan.verification_ranges(size, self.samples)
        total = sum(n for _, n in ranges)
        record.note(f"read back {total} bytes in {len(ranges)} ranges of {device}")
        bad = await asyncio.to_thread(_first_nonzero_in, device, ranges)
        if bad is not None:
            return False, f"non-zero data at byte {bad}"
        found = plan.signatures(await record.run(plan.probe_argv(device)))
        if found:
            return False, plan.clip(f"signature left: {'; '.join(found)}", 1000)
        return True, f"{total} bytes in {len(ranges)} ranges read back as zero; wipefs: no signature"

    async def _reset_gpu(self, gpu_pci: str | None) -> str:
        if not gpu_pci or shutil.which("nvidia-smi") is None:
            return plan.GPU_NO_DRIVER
        try:
            await _Transcript().run(plan.gpu_reset_argv(gpu_pci))
        except CommandFailed as e:
            return f"failed: {e.reason}"
        return plan.GPU_RESET


def parse_device_map(raw: str) -> dict[int, list[str]]:
    """``TESSERA_WIPE_DEVICES``: a JSON object of slot index strings to lists of absolute device paths."""
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{ENV_DEVICES} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{ENV_DEVICES} must be a JSON object of slot -> [device paths], got {type(data).__name__}")
    out: dict[int, list[str]] = {}
    for key, paths in data.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise ValueError(f"{ENV_DEVICES}: slot {key!r} is not a non-negative integer")
        if not (isinstance(paths, list) and all(isinstance(p, str) and p.startswith("/") for p in paths)):
            raise ValueError(f"{ENV_DEVICES}: slot {key} must map to a list of absolute device paths, got {paths!r}")
        out[int(key)] = paths
    return out


def _refuse_if_in_use(device: str) -> None:
    """Raises OSError when the device is missing or held exclusively (mounted, a RAID or LVM member)."""
    try:
        os.close(os.open(device, os.O_RDONLY | os.O_EXCL))
    except OSError as e:
        if e.errno == errno.EBUSY:
            raise OSError(e.errno, "in use (mounted or held by another subsystem): refusing to wipe") from None
        raise OSError(e.errno, f"cannot open: {e.strerror}") from None


def _write_zeros(device: str, ranges: Sequence[tuple[int, int]]) -> None:
    fd = os.open(device, os.O_WRONLY | os.O_EXCL)
    try:
        for offset, length in ranges:
            if os.pwrite(fd, bytes(length), offset) != length:
                raise OSError(errno.EIO, f"short write at byte {offset}")
        os.fsync(fd)
    finally:
        os.close(fd)


def _first_nonzero_in(device: str, ranges: Sequence[tuple[int, int]]) -> int | None:
    """The device offset of the first non-zero byte in ``ranges``, or None. Reads with O_DIRECT (into a
    page-aligned buffer) when the device accepts it; else buffered, after dropping the cached pages."""
    try:
        fd, direct = os.open(device, os.O_RDONLY | os.O_DIRECT), True
    except OSError:
        fd, direct = os.open(device, os.O_RDONLY), False
    try:
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        for offset, length in ranges:
            data = _read(fd, offset, length, direct)
            bad = plan.first_nonzero(data)
            if bad is not None:
                return offset + bad
        return None
    finally:
        os.close(fd)


def _read(fd: int, offset: int, length: int, direct: bool) -> bytes:
    if direct and offset % plan.BLOCK == 0 and length % plan.BLOCK == 0:
        with mmap.mmap(-1, length) as buf:          # page-aligned, as O_DIRECT requires
            n = os.preadv(fd, [buf], offset)
            if n != length:
                raise OSError(errno.EIO, f"short read at byte {offset}: {n} of {length}")
            return buf[:]
    if direct:                                      # an unaligned range: read it through a buffered descriptor
        with open(f"/proc/self/fd/{fd}", "rb", buffering=0) as f:
            return os.pread(f.fileno(), length, offset)
    return os.pread(fd, length, offset)
