"""Child processes "on a node": started inside the node's network namespace, each in its own process group.

A daemon runs under ``nsenter --net`` (not ``ip netns exec``: that remounts /sys, and slurmd then finds no
cgroup file system) and ``unshare --uts`` with the node's name as host name, so slurmctld recognises itself
in ``SlurmctldHost`` and a job's ``hostname`` names its node. Both exec, so the recorded pid is the daemon's.
"""
from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterable, Mapping
from pathlib import Path

from ...domain.runtime import ClusterError
from ..processes import alive, carrying, spawn, start_time, until_gone

__all__ = ["Children", "alive", "carrying_conf", "in_node", "kill_all", "run", "start_time"]

NETNS_DIR = Path("/run/netns")


def in_node(argv: list[str], netns: str | None, hostname: str | None = None) -> list[str]:
    """``argv`` as run on a node: in its namespace, under its own host name (neither on a guest/bare metal)."""
    if netns is None:
        return argv
    wrapped = argv
    if hostname:
        wrapped = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]
    return ["nsenter", f"--net={NETNS_DIR / netns}", "--", *wrapped]


class Children:
    """The daemons this process started: their ``Process`` objects, kept so that each is reaped."""

    def __init__(self) -> None:
        self._procs: dict[int, asyncio.subprocess.Process] = {}

    async def spawn(self, argv: list[str], log: Path, env: Mapping[str, str]) -> int:
        """Start ``argv`` detached in its own session (so its own process group), output appended to ``log``."""
        proc = await spawn(argv, log, env)
        self._procs[proc.pid] = proc
        return proc.pid

    def exited(self, pid: int) -> int | None:
        """The exit status of a child that has ended (None: still running, or not ours)."""
        proc = self._procs.get(pid)
        return proc.returncode if proc else None

    async def kill_groups(self, pids: Iterable[int], grace_s: float = 5.0, *, hard: bool = False) -> None:
        """SIGTERM each process group, SIGKILL what is left after ``grace_s``; reap our own children.
        ``hard``: SIGKILL at once (nothing of theirs is kept, so they need no orderly shutdown)."""
        pids = [p for p in pids if alive(p)]
        _signal_groups(pids, signal.SIGKILL if hard else signal.SIGTERM)
        if not await until_gone(pids, grace_s):
            _signal_groups(pids, signal.SIGKILL)
            await until_gone(pids, grace_s)
        for pid in pids:
            proc = self._procs.pop(pid, None)
            if proc is not None:
                try:
                    await asyncio.wait_for(proc.wait(), grace_s)
                except TimeoutError:
                    pass


def _signal_groups(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:   # not a group leader we own: signal the process itself
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def carrying_conf(conf: Path) -> list[int]:
    """Every process whose environment names ``conf`` as its SLURM_CONF: the cluster's daemons, their step
    daemons (slurmstepd leaves slurmd's process group) and the jobs' tasks."""
    return carrying(f"SLURM_CONF={conf}")


def kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def run(argv: list[str], env: Mapping[str, str], timeout_s: float = 30.0) -> str:
    """Run a short command (scontrol) to its end; its stdout, or ClusterError with its stderr."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env={**os.environ, **env})
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ClusterError(f"{argv[-1] if argv else '?'}: no answer in {timeout_s}s") from None
    if proc.returncode != 0:
        raise ClusterError(f"{' '.join(a for a in argv if not a.startswith('--net'))[:200]}: "
                           f"{(err or out).decode(errors='replace').strip()[:500]}")
    return out.decode(errors="replace")
