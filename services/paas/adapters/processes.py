"""What every cluster driver does with the daemons it starts on a cluster's nodes: start them detached, tell whether
one still runs, wait for some to end, and find them again by a mark in their environment (a restart of the service
finds the daemons it started before; nothing is found by process name)."""
from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..domain.runtime import ClusterError


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state first), None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot): with its pid, it names one process for good."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def alive(pid: int | None, started: int | None = None) -> bool:
    """The process exists and is not a zombie (a killed child not yet reaped counts as gone); with ``started``,
    it is also the process that started then (a recorded pid the kernel has since reused is not ours)."""
    fields = _stat(pid) if pid else None
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return started is None or int(fields[19]) == started


async def until_gone(pids: Iterable[int], timeout_s: float) -> bool:
    """Wait until none of ``pids`` runs; False when some still do after ``timeout_s``."""
    pids = list(pids)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while any(alive(p) for p in pids):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def carrying(*entries: str) -> list[int]:
    """Every live process (but this one) whose environment holds every ``NAME=value`` of ``entries``."""
    wanted = {e.encode() for e in entries}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= env and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


async def spawn(argv: list[str], log: Path, env: Mapping[str, str]) -> asyncio.subprocess.Process:
    """Start ``argv`` in a session of its own (its own process group: it outlives nothing it should not, and is
    stopped by pid), output appended to ``log``."""
    with open(log, "ab") as out:
        try:
            return await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **env}, start_new_session=True)
        except OSError as exc:
            raise ClusterError(f"cannot start {argv[0]}: {exc}") from exc
