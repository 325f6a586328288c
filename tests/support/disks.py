"""Loop devices standing in for a slot's NVMe (the wipe tests): small files filled with a known pattern, each
attached as a loop device; blocking helpers (call them through asyncio.to_thread from async tests)."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tooling.bmc_lab import make_loop_disk, remove_loop_disk

PATTERN = b"TESSERA-TENANT-DATA-"


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def fill_pattern(device: str) -> None:
    """The pattern over the whole of ``device`` (a block device), flushed."""
    chunk = (PATTERN * (65536 // len(PATTERN) + 1))[:65536]
    size = int(_run("blockdev", "--getsize64", device))
    with open(device, "r+b") as f:
        for _ in range(size // len(chunk)):
            f.write(chunk)
        f.flush()
    _run("blockdev", "--flushbufs", device)


def pattern_on(device: str) -> bool:
    """Whether any of the pattern is left on ``device``."""
    _run("blockdev", "--flushbufs", device)
    with open(device, "rb") as f:
        return PATTERN in f.read()


def set_read_only(device: str, on: bool = True) -> None:
    """The block device refuses writes (``blockdev --setro``), or takes them again."""
    _run("blockdev", "--setro" if on else "--setrw", device)


@dataclass
class LoopDisks:
    """``count`` loop devices over files of ``mib`` MiB in ``folder``; ``fill()`` writes the pattern over each."""

    folder: Path
    count: int
    mib: int = 8
    devices: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def attach(self) -> LoopDisks:
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            for i in range(self.count):
                path = self.folder / f"nvme{i}.img"
                self.files.append(path)
                self.devices.append(make_loop_disk(path, self.mib))
            self.fill()
        except BaseException:
            self.detach()
            raise
        return self

    def fill(self, index: int | None = None) -> None:
        """The pattern over the whole of each disk (or of one), written through its loop device."""
        for dev in self.devices if index is None else [self.devices[index]]:
            fill_pattern(dev)

    def has_pattern(self, index: int) -> bool:
        """Whether any of the pattern is left on disk ``index`` (read through its loop device)."""
        return pattern_on(self.devices[index])

    def set_read_only(self, index: int, on: bool = True) -> None:
        set_read_only(self.devices[index], on)

    def device_map(self, slots: int | None = None) -> dict[str, list[str]]:
        """TESSERA_WIPE_DEVICES: slot i → disk i."""
        return {str(i): [d] for i, d in enumerate(self.devices[:slots])}

    def detach(self) -> None:
        for dev in self.devices:
            subprocess.run(["blockdev", "--setrw", dev], capture_output=True)
            remove_loop_disk(dev)
        self.devices.clear()
        for f in self.files:
            f.unlink(missing_ok=True)
        self.files.clear()
