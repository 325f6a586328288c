"""``SlurmRuntime``: Tessera's ClusterRuntime over real Slurm 22.05 daemons, one set per cluster.

State lives under ``state_root/<cluster_id>/`` and nowhere else; the handle names the state directory, the
controller's namespace and the pids, so a new runtime (after a crash) finds a started cluster again.
"""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from ...domain.runtime import (
    TERMINAL,
    ClusterError,
    ClusterHandle,
    ClusterNode,
    ClusterSpec,
    JobSpec,
    JobStatus,
    NodeUse,
)
from .config import CTLD_PORT, ClusterFiles
from .daemons import ClusterDaemons
from .jobs import comment, gpu_count, job_status, node_use, refused, running_per_node, submit_body
from .processes import Children
from .requeue import again, pending, release, requeued, running_on
from .rest import SlurmRest, Token, raise_for

READY_TIMEOUT_S = 90.0
UNREADY = {"unknown", "down", "future"}


class SlurmRuntime:
    kind = "slurm"

    def __init__(self, state_root: Path, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.state_root = Path(state_root)
        self.ready_timeout_s = ready_timeout_s
        self._children = Children()
        self._tokens: dict[str, Token] = {}
        self._locks: dict[str, asyncio.Lock] = {}   # one change at a time per cluster (start, set_nodes, stop)

    # -- plumbing ---------------------------------------------------------------------------------------
    def _daemons(self, cluster_id) -> ClusterDaemons:
        return ClusterDaemons(ClusterFiles(self.state_root / str(cluster_id)), self._children)

    def _lock(self, cluster_id) -> asyncio.Lock:
        return self._locks.setdefault(str(cluster_id), asyncio.Lock())

    def _rest(self, handle: ClusterHandle) -> SlurmRest:
        key = str(handle.cluster_id)
        if key not in self._tokens:
            daemons, netns = self._daemons(handle.cluster_id), handle.details.get("controller_netns")
            self._tokens[key] = Token(lambda lifespan: daemons.token(netns, lifespan))
        return SlurmRest(str(ClusterFiles(self.state_root / key).rest_socket), self._tokens[key])

    def _handle(self, spec: ClusterSpec, daemons: ClusterDaemons) -> ClusterHandle:
        ctl, f = spec.controller, daemons.files
        details = {"state_dir": str(f.root), "slurm_conf": str(f.slurm_conf), "controller_node": ctl.name,
                   "controller_netns": ctl.netns, "nodes": [n.name for n in spec.nodes], "pids": daemons.pids(),
                   "logs": str(f.logs), "jobs_dir": str(f.jobs), "slurm_version": "22.05", "api_version": "v0.0.38"}
        return ClusterHandle(cluster_id=spec.cluster_id, controller=f"{ctl.address}:{CTLD_PORT}",
                             api=f"unix:{f.rest_socket}", driver="slurm", details=details)

    # -- lifecycle --------------------------------------------------------------------------------------
    async def start(self, spec: ClusterSpec) -> ClusterHandle:
        """Start whatever of the cluster is not running; return once slurmrestd pings and every node is up."""
        async with self._lock(spec.cluster_id):
            daemons = self._daemons(spec.cluster_id)
            daemons.prepare(spec)
            await self._ensure_daemons(spec, daemons)
            handle = self._handle(spec, daemons)
            await self._wait_ready(spec, daemons, handle)
            return self._handle(spec, daemons)

    async def _ensure_daemons(self, spec: ClusterSpec, daemons: ClusterDaemons, *, but: str | None = None) -> None:
        """Start what is not running (``but``: not that node's slurmd)."""
        await daemons.ensure_munged()
        await self._wait_for_file(daemons, daemons.files.munge_socket, "munged", watch={"munged"})
        await daemons.ensure_slurmctld(spec.controller)
        for node in spec.nodes:
            if node.name != but:
                await daemons.ensure_slurmd(node)
        await daemons.ensure_slurmrestd(spec.controller)
        await self._wait_for_file(daemons, daemons.files.rest_socket, "slurmrestd")

    async def _wait_for_file(self, daemons: ClusterDaemons, path: Path, daemon: str, watch: set[str] | None = None) -> None:
        async def exists() -> bool:
            return path.exists()
        await self._until(daemons, exists, f"{daemon}'s socket {path}", watch)

    async def _wait_ready(self, spec: ClusterSpec, daemons: ClusterDaemons, handle: ClusterHandle) -> None:
        rest, wanted = self._rest(handle), {n.name for n in spec.nodes}

        async def ready() -> bool:
            if not await rest.ping():
                return False
            up = {n["name"] for n in await rest.nodes()
                  if n.get("state", "unknown").lower() not in UNREADY
                  and "NOT_RESPONDING" not in {f.upper() for f in n.get("state_flags", [])}}
            return wanted <= up
        await self._until(daemons, ready, "the controller's ping and every node registered")

    async def _until(self, daemons: ClusterDaemons, probe, what: str, watch: set[str] | None = None) -> None:
        """Poll ``probe`` until true; a daemon (of ``watch``, default all) that died meanwhile fails at once,
        with its log's tail."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        while True:
            for name, pid in daemons.pids().items():
                if (watch is None or name in watch) and not daemons.alive(name):
                    raise ClusterError(f"{name} (pid {pid}) exited while waiting for {what}: {_tail(daemons, name)}")
            try:
                if await probe():
                    return
            except ClusterError:
                pass
            if loop.time() > deadline:
                raise ClusterError(f"waited {self.ready_timeout_s}s for {what}")
            await asyncio.sleep(0.2)

    async def set_nodes(self, spec: ClusterSpec, handle: ClusterHandle) -> ClusterHandle:
        """Rewrite the configuration; when it changed restart slurmctld (22.05 reads its node list only at start;
        its saved state keeps the queue), stop removed nodes' slurmd, start new ones, and reconfigure."""
        async with self._lock(spec.cluster_id):
            daemons = self._daemons(spec.cluster_id)
            controller = handle.details.get("controller_node")
            if controller and controller != spec.controller.name:
                raise ClusterError(f"the controller node {controller} cannot change", permanent=True)
            daemons.prepare(spec)
            wanted, rest = {f"slurmd:{n.name}" for n in spec.nodes}, self._rest(handle)
            ran_there: set[int] = set()
            for name in [n for n in daemons.pids() if n.startswith("slurmd:") and n not in wanted]:
                # DOWN before it goes: a node lost for good has its jobs requeued (a drained one runs none)
                ran_there |= await self._down(daemons, rest, handle.details.get("controller_netns"),
                                              name.removeprefix("slurmd:"))
                await daemons.stop(name)
            await self._until(daemons, lambda: requeued(rest, ran_there), "the lost node's jobs requeued")
            changed = not daemons.controller_current()
            if changed:
                await daemons.stop("slurmctld")
            await self._ensure_daemons(spec, daemons)
            if changed:
                await self._until(daemons, self._rest(handle).ping, "the restarted controller's ping")
                await daemons.scontrol(spec.controller.netns, "reconfigure")
            await self._wait_ready(spec, daemons, handle)
            if ran_there:
                await release(daemons, spec.controller.netns, rest, ran_there)
            return self._handle(spec, daemons)

    async def replace_node(self, spec: ClusterSpec, handle: ClusterHandle, node: ClusterNode) -> ClusterHandle:
        """``node`` lost with its host, back in a new slot (same name, maybe a new address). Another node: set
        DOWN first, so slurmctld requeues the batch jobs that ran there (``requeue.py``). ``nodes[0]``: its
        slurmctld and slurmrestd start again in the new slot first (the StateSaveLocation keeps the queue), then
        it is set DOWN alike. Either way whatever lives of its old slurmd is stopped, the configuration names its
        new address (slurmctld restarts when it changed: 22.05 reads NodeAddr only at start), its slurmd starts in
        the new slot, the node is resumed, and its requeued jobs may start at once."""
        async with self._lock(spec.cluster_id):
            daemons = self._daemons(spec.cluster_id)
            controller = node.name == spec.controller.name
            ran_there: set[int] = set()
            if not controller:
                ran_there = await self._down(daemons, self._rest(handle), handle.details.get("controller_netns"),
                                             node.name)
            await daemons.stop(f"slurmd:{node.name}")
            if controller:
                for name in ("slurmrestd", "slurmctld"):
                    await daemons.stop(name)
                self._tokens.pop(str(spec.cluster_id), None)    # its token came from the old namespace
            daemons.prepare(spec)
            restart = not daemons.controller_current()
            if restart:
                await daemons.stop("slurmctld")
            await self._ensure_daemons(spec, daemons, but=node.name)
            new, netns = self._handle(spec, daemons), spec.controller.netns
            rest = self._rest(new)
            if restart:
                await self._until(daemons, rest.ping, "the restarted controller's ping")
                await daemons.scontrol(netns, "reconfigure")
            if controller:       # before its new slurmd registers: the jobs it ran are not there to be found
                ran_there = await self._down(daemons, rest, netns, node.name)
            await daemons.ensure_slurmd(node)
            await self._resume(daemons, netns, node.name)
            await self._wait_ready(spec, daemons, new)
            await self._until(daemons, lambda: requeued(rest, ran_there), "the lost node's jobs requeued")
            await release(daemons, netns, rest, ran_there)
            return self._handle(spec, daemons)

    @staticmethod
    async def _down(daemons: ClusterDaemons, rest: SlurmRest, netns: str | None, node: str) -> set[int]:
        """Set ``node`` DOWN (Slurm requeues what ran there); the ids of those jobs. Its controller gone too, or
        the node down already: nothing to requeue from here."""
        try:
            ran_there = await running_on(rest, node)
            await daemons.scontrol(netns, "update", f"NodeName={node}", "State=DOWN", "Reason=lost with its host")
            return ran_there
        except ClusterError:
            return set()

    @staticmethod
    async def _resume(daemons: ClusterDaemons, netns: str | None, node: str) -> None:
        try:
            await daemons.scontrol(netns, "update", f"NodeName={node}", "State=RESUME")
        except ClusterError as exc:      # not down (any more): ReturnToService=2 returns a node that registers
            if "Invalid node state" not in str(exc):
                raise

    async def requeue(self, handle: ClusterHandle, external_ids: list[str]) -> list[str]:
        """Run again the jobs a lost node's failure ended (``requeue.again``), starting at once."""
        daemons, netns, rest = self._daemons(handle.cluster_id), handle.details.get("controller_netns"), self._rest(handle)
        ids = await again(daemons, netns, rest, external_ids)
        if ids:
            await self._until(daemons, lambda: pending(rest, {int(i) for i in ids}), "the requeued jobs pending")
            await release(daemons, netns, rest, {int(i) for i in ids})
        return ids

    async def drain(self, handle: ClusterHandle, node: str, reason: str) -> None:
        daemons = self._daemons(handle.cluster_id)
        await daemons.scontrol(handle.details.get("controller_netns"), "update", f"NodeName={node}", "State=DRAIN",
                               f"Reason={reason or 'drained by tessera'}")

    async def nodes(self, handle: ClusterHandle) -> list[NodeUse]:
        rest = self._rest(handle)
        running = running_per_node(await rest.jobs())
        return [node_use(n, running.get(n["name"], 0)) for n in await rest.nodes()]

    async def stop(self, handle: ClusterHandle) -> None:
        async with self._lock(handle.cluster_id):
            daemons = self._daemons(handle.cluster_id)
            await daemons.stop_all()
            self._tokens.pop(str(handle.cluster_id), None)
            shutil.rmtree(daemons.files.root, ignore_errors=True)
            if daemons.files.spool_link.is_symlink():
                daemons.files.spool_link.unlink(missing_ok=True)

    # -- jobs -------------------------------------------------------------------------------------------
    async def submit(self, handle: ClusterHandle, job: JobSpec) -> str:
        rest = self._rest(handle)
        tag = comment(job)
        existing = sorted(j["job_id"] for j in await rest.jobs() if j.get("comment") == tag and not refused(j))
        if existing:
            return str(existing[0])
        node_gpus = [gpu_count(n.get("gres", "")) for n in await rest.nodes()]
        body = submit_body(job, node_gpus, self._daemons(handle.cluster_id).files)
        _, answer = await rest.call("POST", "/job/submit", body)
        return str(answer["job_id"])

    async def job(self, handle: ClusterHandle, external_id: str) -> JobStatus:
        raw = await self._rest(handle).job(external_id)
        if raw is None:
            raise ClusterError(f"slurm knows no job {external_id}", permanent=True)
        return job_status(raw)

    async def logs(self, handle: ClusterHandle, external_id: str, limit_bytes: int = 65536) -> str:
        path = self._daemons(handle.cluster_id).files.job_output(external_id)
        try:
            with open(path, "rb") as out:
                size = out.seek(0, 2)
                out.seek(max(0, size - limit_bytes))
                return out.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    async def cancel(self, handle: ClusterHandle, external_id: str) -> None:
        rest = self._rest(handle)
        status, answer = await rest.call("DELETE", f"/job/{external_id}", check=False)
        if status < 400 and not answer.get("errors"):
            return
        raw = await rest.job(external_id)
        if raw is None or job_status(raw).state in TERMINAL:
            return
        raise_for(status, answer, f"cancel {external_id}")

    async def pending(self, handle: ClusterHandle) -> int:
        return sum(1 for j in await self._rest(handle).jobs() if j.get("job_state") == "PENDING")


def _tail(daemons: ClusterDaemons, name: str, size: int = 600) -> str:
    path = daemons.files.logs / f"{name}.out"
    try:
        return path.read_bytes()[-size:].decode(errors="replace").strip()
    except OSError:
        return "(no log)"
