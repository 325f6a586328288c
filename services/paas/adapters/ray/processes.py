"""A Ray cluster's processes: started detached (a session of their own, so they outlive a restart of the service
and are stopped by pid), and found again by the marks their environment carries (``commands.CLUSTER_MARK``).
"""
from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterable, Mapping
from pathlib import Path

from ...domain.runtime import ClusterError
from ..processes import alive, carrying, until_gone
from ..processes import spawn as shared_spawn
from .commands import CLUSTER_MARK, NODE_MARK

__all__ = ["alive", "kill", "kill_marked", "marked", "run", "spawn"]


async def spawn(argv: list[str], log: Path, env: Mapping[str, str]) -> int:
    """Start ``argv`` in a session of its own, output appended to ``log``; its pid (asyncio reaps it)."""
    return (await shared_spawn(argv, log, env)).pid


async def run(argv: list[str], env: Mapping[str, str], timeout_s: float = 60.0) -> str:
    """Run a short command to its end: its output, or ClusterError with it."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, env={**os.environ, **env})
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise ClusterError(f"{' '.join(argv[:6])}: no answer in {timeout_s}s") from None
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise ClusterError(f"{' '.join(argv[:6])}: exit {proc.returncode}: {text.strip()[-500:]}")
    return text


def marked(cluster: str, node: str | None = None) -> list[int]:
    """Every live process whose environment carries the cluster's mark (and the node's, given ``node``)."""
    return carrying(f"{CLUSTER_MARK}={cluster}", *((f"{NODE_MARK}={node}",) if node is not None else ()))


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


async def kill(pids: Iterable[int], grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace_s``: Ray's head takes long to leave gracefully, and
    what it would save is removed with the cluster anyway."""
    pids = [p for p in pids if alive(p)]
    _signal(pids, signal.SIGTERM)
    if not await until_gone(pids, grace_s):
        _signal(pids, signal.SIGKILL)
        if not await until_gone(pids, 10.0):
            raise ClusterError(f"processes {[p for p in pids if alive(p)]} outlived SIGKILL")


async def kill_marked(cluster: str, node: str | None = None) -> None:
    """Kill the cluster's (or one node's) processes; twice, for what a dying daemon started meanwhile. Only
    marked processes: a pid recorded before a restart of the service may name someone else's process by now."""
    for _ in range(2):
        await kill(marked(cluster, node))
