"""RayRuntime: a tenant's Ray cluster on its own nodes, driven through Ray's Jobs API (real Ray, its own venv).

The head (GCS, dashboard, Jobs API) runs in ``nodes[0]``'s namespace on its tenant address; every other node
runs a raylet joined to it. Per cluster: ``<state_root>/<cluster id>/`` (the API socket, daemon logs, drains)
and ``<short_root>/tr-<id>/`` (Ray's temp dirs, short for its socket paths). Nothing is shared between
clusters, so several tenants' clusters run side by side on one host.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from dataclasses import asdict, replace
from pathlib import Path

from ...domain.runtime import ClusterError, ClusterHandle, ClusterNode, ClusterSpec, JobSpec, JobStatus, NodeUse
from .api import RayApi
from .commands import GCS_PORT, api_bridge_argv, cluster_temp_root, daemon_env, drain_argv, head_argv, node_temp_dir, worker_argv
from .jobs import SUBMISSION_PREFIX, status_of, submission
from .processes import alive, kill_marked, run, spawn
from .usage import alive_by_address, node_uses

REPO_VENV = Path(__file__).resolve().parents[4] / ".venv-ray"


class RayRuntime:
    kind = "ray"

    def __init__(self, state_root: Path, ray_venv: Path = REPO_VENV, short_root: Path = Path("/tmp"),
                 start_timeout_s: float = 120.0) -> None:
        self.state_root, self.ray_venv, self.short_root = Path(state_root), Path(ray_venv), Path(short_root)
        self.start_timeout_s = start_timeout_s

    # --- cluster -----------------------------------------------------------------------------------------

    async def start(self, spec: ClusterSpec) -> ClusterHandle:
        """Head, API bridge, then the workers; returns once the Jobs API answers and every node is ALIVE. A
        cluster whose API answers is kept (``set_nodes`` starts what is missing); anything else starts afresh."""
        state = self._state_dir(spec.cluster_id)
        api = RayApi(str(state / "api.sock"))
        if (state / "handle.json").exists() and await api.version():
            return await self.set_nodes(spec, self._handle(spec, json.loads((state / "handle.json").read_text())))
        await self.stop(ClusterHandle(spec.cluster_id, "", "", "ray"))   # what a failed start left
        (state / "logs").mkdir(parents=True)
        try:
            head = spec.controller
            pid = await self._start_node(spec.cluster_id, head, None)
            await spawn(api_bridge_argv(head, state / "api.sock"), state / "logs" / "api.log",
                        self._env(spec.cluster_id, head.name))
            version = await self._until(api.version, "the Jobs API answers", pid, state / "logs" / f"{head.name}.log")
            handle = self._handle(spec, {"ray_version": version, "nodes": {head.name: pid}})
            return await self.set_nodes(spec, handle)
        except BaseException:
            await self.stop(ClusterHandle(spec.cluster_id, "", "", "ray"))
            raise

    async def set_nodes(self, spec: ClusterSpec, handle: ClusterHandle) -> ClusterHandle:
        if spec.controller.name != handle.details.get("head"):
            raise ClusterError("a Ray cluster keeps its head: nodes[0] cannot change", permanent=True)
        api, pids = self._api(handle), dict(handle.details.get("nodes", {}))
        wanted = {n.name: n for n in spec.nodes}
        drains = self._marks(handle.cluster_id, "drains") & set(wanted)
        for name in [n for n in pids if n not in wanted]:
            await self._stop_node(handle.cluster_id, name)
            pids.pop(name)
        joined = alive_by_address(await api.nodes())
        for node in spec.nodes[1:]:
            up = (joined.get(node.address) or {}).get("state") == "ALIVE"
            # (re)start a node whose daemon is gone, or whose raylet left after a drain (scaled in, then out again)
            if not alive(pids.get(node.name)) or node.name in drains and not up:
                await self._stop_node(handle.cluster_id, node.name)     # a drained node's leftovers, if any
                pids[node.name] = await self._start_node(handle.cluster_id, node, spec.controller)
                drains.discard(node.name)
        self._save_marks(handle.cluster_id, "drains", drains)
        addresses = {n.address for n in spec.nodes}

        async def all_joined() -> bool:
            joined_now = {a for a, r in alive_by_address(await api.nodes()).items() if r.get("state") == "ALIVE"}
            return addresses <= joined_now
        await self._until(all_joined, f"all {len(addresses)} nodes joined", pids.get(spec.controller.name))
        new = self._handle(spec, {**handle.details, "nodes": pids})
        (self._state_dir(spec.cluster_id) / "handle.json").write_text(json.dumps(new.details))
        return new

    async def replace_node(self, spec: ClusterSpec, handle: ClusterHandle, node: ClusterNode) -> ClusterHandle:
        """A worker lost with its host starts again in its new slot (whatever of it lives is stopped first; the
        GCS has already counted its raylet dead, and a job whose driver ran there failed). The head cannot move:
        its GCS state (jobs, actors) went with the host."""
        if node.name == handle.details.get("head"):
            raise ClusterError(f"the head node {node.name} was lost: the cluster's GCS state went with it, so the "
                               "Ray cluster cannot be moved", permanent=True)
        await self._stop_node(handle.cluster_id, node.name)
        pids = {k: v for k, v in handle.details.get("nodes", {}).items() if k != node.name}
        return await self.set_nodes(spec, replace(handle, details={**handle.details, "nodes": pids}))

    async def drain(self, handle: ClusterHandle, node: str, reason: str) -> None:
        """Recorded first (``nodes`` reads it), then asked of the GCS while the node's raylet is ALIVE."""
        if node == handle.details.get("head"):
            raise ClusterError("the head cannot be drained: it hosts the cluster's controller", permanent=True)
        member = self._member(handle, node)
        self._save_marks(handle.cluster_id, "drains", self._marks(handle.cluster_id, "drains") | {node})
        record = alive_by_address(await self._api(handle).nodes()).get(member.address) or {}
        if record.get("state") == "ALIVE":
            head = self._member(handle, handle.details["head"])
            await run(drain_argv(self.ray_venv, head, record["node_id"], reason),
                      {"PATH": daemon_env(self.ray_venv, handle.cluster_id, "")["PATH"]})

    async def nodes(self, handle: ClusterHandle) -> list[NodeUse]:
        api = self._api(handle)
        ray_nodes, usage, jobs = await asyncio.gather(api.nodes(), api.usage_by_node(), api.jobs())
        addresses = {name: m["address"] for name, m in handle.details.get("members", {}).items()}
        return node_uses(addresses, ray_nodes, usage, jobs, self._marks(handle.cluster_id, "drains"))

    async def stop(self, handle: ClusterHandle) -> None:
        await kill_marked(str(handle.cluster_id))
        shutil.rmtree(self._state_dir(handle.cluster_id), ignore_errors=True)
        shutil.rmtree(cluster_temp_root(self.short_root, handle.cluster_id), ignore_errors=True)

    # --- jobs ----------------------------------------------------------------------------------------------

    async def submit(self, handle: ClusterHandle, job: JobSpec) -> str:
        if not job.command:
            raise ClusterError("a job needs a command", permanent=True)
        return await self._api(handle).submit(submission(job))

    async def job(self, handle: ClusterHandle, external_id: str) -> JobStatus:
        api = self._api(handle)
        record = await api.job(external_id)
        if record is None:
            raise ClusterError(f"no Ray job {external_id}", permanent=True)
        names = {}
        if record.get("driver_node_id"):
            by_address = {m["address"]: n for n, m in handle.details.get("members", {}).items()}
            names = {r["node_id"]: by_address.get(r.get("node_ip"), "") for r in await api.nodes()}
        if record.get("status") == "PENDING" and external_id in self._marks(handle.cluster_id, "cancels"):
            return replace(status_of(record, names), state="CANCELLED", message="cancelled before it started")
        return status_of(record, names)

    async def logs(self, handle: ClusterHandle, external_id: str, limit_bytes: int = 65536) -> str:
        text = (await self._api(handle).logs(external_id)).encode()
        return text[-limit_bytes:].decode(errors="ignore")

    async def cancel(self, handle: ClusterHandle, external_id: str) -> None:
        """Ray 2.60 cannot stop a job still waiting for resources (its stop waits for the job's supervisor
        actor, which waits for them too): such a job is recorded as cancelled, reads CANCELLED, leaves the
        queue, and is stopped by Ray the moment it would start."""
        api = self._api(handle)
        record = await api.job(external_id)
        if record is not None and record.get("status") == "PENDING":
            self._save_marks(handle.cluster_id, "cancels", self._marks(handle.cluster_id, "cancels") | {external_id})
        await api.stop(external_id)

    async def pending(self, handle: ClusterHandle) -> int:
        cancelled = self._marks(handle.cluster_id, "cancels")
        return sum(1 for j in await self._api(handle).jobs()
                   if j.get("status") == "PENDING" and (j.get("submission_id") or "").startswith(SUBMISSION_PREFIX)
                   and j["submission_id"] not in cancelled)

    # --- helpers -------------------------------------------------------------------------------------------

    def _state_dir(self, cluster_id: uuid.UUID) -> Path:
        return self.state_root / str(cluster_id)

    def _api(self, handle: ClusterHandle) -> RayApi:
        return RayApi(handle.api.removeprefix("unix:"))

    def _env(self, cluster_id: uuid.UUID, node: str) -> dict[str, str]:
        return daemon_env(self.ray_venv, cluster_id, node)

    def _handle(self, spec: ClusterSpec, details: dict) -> ClusterHandle:
        head, state = spec.controller, self._state_dir(spec.cluster_id)
        members = {n.name: {**asdict(n), "allocation_id": str(n.allocation_id), "gpu_devices": list(n.gpu_devices)}
                   for n in spec.nodes}
        return ClusterHandle(cluster_id=spec.cluster_id, controller=f"{head.address}:{GCS_PORT}",
                             api=f"unix:{state / 'api.sock'}", driver="ray",
                             details={**details, "head": head.name, "members": members, "state_dir": str(state),
                                      "temp_root": str(cluster_temp_root(self.short_root, spec.cluster_id))})

    def _member(self, handle: ClusterHandle, name: str) -> ClusterNode:
        member = handle.details.get("members", {}).get(name)
        if member is None:
            raise ClusterError(f"no node {name} in the cluster", permanent=True)
        return ClusterNode(**{**member, "allocation_id": uuid.UUID(member["allocation_id"]),
                              "gpu_devices": tuple(member["gpu_devices"])})

    async def _start_node(self, cluster_id: uuid.UUID, node: ClusterNode, head: ClusterNode | None) -> int:
        temp = node_temp_dir(self.short_root, cluster_id, node.name)
        temp.mkdir(parents=True, exist_ok=True)
        argv = (head_argv(self.ray_venv, node, temp) if head is None
                else worker_argv(self.ray_venv, node, head, temp))
        return await spawn(argv, self._state_dir(cluster_id) / "logs" / f"{node.name}.log",
                                     self._env(cluster_id, node.name))

    async def _stop_node(self, cluster_id: uuid.UUID, name: str) -> None:
        await kill_marked(str(cluster_id), name)
        shutil.rmtree(node_temp_dir(self.short_root, cluster_id, name), ignore_errors=True)

    def _marks(self, cluster_id: uuid.UUID, kind: str) -> set[str]:
        """What the driver remembers beside Ray: ``drains`` (node names), ``cancels`` (pending jobs cancelled)."""
        try:
            return set(json.loads((self._state_dir(cluster_id) / f"{kind}.json").read_text()))
        except (OSError, ValueError):
            return set()

    def _save_marks(self, cluster_id: uuid.UUID, kind: str, marks: set[str]) -> None:
        (self._state_dir(cluster_id) / f"{kind}.json").write_text(json.dumps(sorted(marks)))

    async def _until(self, probe, what: str, head_pid: int, log: Path | None = None):
        """Poll ``probe`` until truthy; ClusterError once the head has died or ``start_timeout_s`` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout_s
        while not (value := await probe()):
            if not alive(head_pid) or loop.time() > deadline:
                tail = log.read_text(errors="replace")[-800:] if log and log.exists() else ""
                why = "the head exited" if not alive(head_pid) else f"{self.start_timeout_s}s passed"
                raise ClusterError(f"ray cluster: waited for {what}, but {why}. {tail}")
            await asyncio.sleep(0.25)
        return value
