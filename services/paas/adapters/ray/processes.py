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
from .commands import CLUSTER_MARK, NODE_MARK


def alive(pid: int | None) -> bool:
    """The process exists and is not a zombie (killed, not yet reaped: gone)."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def spawn(argv: list[str], log: Path, env: Mapping[str, str]) -> int:
    """Start ``argv`` in a session of its own, output appended to ``log``; its pid (asyncio reaps it)."""
    with open(log, "ab") as out:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **env}, start_new_session=True)
        except OSError as exc:
            raise ClusterError(f"cannot start {argv[0]}: {exc}") from exc
    return proc.pid


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
    wanted = {f"{CLUSTER_MARK}={cluster}".encode()}
    if node is not None:
        wanted.add(f"{NODE_MARK}={node}".encode())
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


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


async def _until_gone(pids: list[int], timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while any(alive(p) for p in pids):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def kill(pids: Iterable[int], grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace_s``: Ray's head takes long to leave gracefully, and
    what it would save is removed with the cluster anyway."""
    pids = [p for p in pids if alive(p)]
    _signal(pids, signal.SIGTERM)
    if not await _until_gone(pids, grace_s):
        _signal(pids, signal.SIGKILL)
        if not await _until_gone(pids, 10.0):
            raise ClusterError(f"processes {[p for p in pids if alive(p)]} outlived SIGKILL")


async def kill_marked(cluster: str, node: str | None = None) -> None:
    """Kill the cluster's (or one node's) processes; twice, for what a dying daemon started meanwhile. Only
    marked processes: a pid recorded before a restart of the service may name someone else's process by now."""
    for _ in range(2):
        await kill(marked(cluster, node))
