"""``ClusterRuntime`` for Kubernetes, rendered (``driver = "recording"``): every configuration and manifest is
rendered, validated offline and handed to a ``KubernetesApplier``; with the recording applier nothing runs.

So a submitted job is recorded and stays PENDING with the message "recorded: no Kubernetes server": its state
never advances (nothing would move it), except to CANCELLED when Tessera itself cancels it. A cordoned node
reports ``drained`` at once (no work can be on it). The handle's ``api`` names the socket a real applier's
``socat`` would serve the API server on (in the controller's namespace slot); nothing listens there.

Per cluster, under ``state_root/<cluster id>/`` (0700): ``pki/ca.{key,crt}`` (the cluster's CA, made here so
joins can pin it), ``plan.json`` (token, CA hash, subnets: a retry renders the same), ``nodes.json``,
``jobs.json`` (job id → Job: the idempotency lookup), ``kubeadm/<node>.yaml``, ``capi.yaml`` (the same cluster
as Cluster API manifests, for a management cluster) and the applier's ``calls.jsonl``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import yaml

from services.paas.adapters.kubernetes import capi, jobs, kubeadm
from services.paas.adapters.kubernetes.applier import CALLS, KubernetesApplier, RecordingApplier
from services.paas.adapters.kubernetes.schemas import ManifestError, validate_all
from services.paas.domain.runtime import (
    ClusterError,
    ClusterHandle,
    ClusterKind,
    ClusterNode,
    ClusterSpec,
    JobSpec,
    JobStatus,
    NodeUse,
)

RECORDED = "recorded: no Kubernetes server"
CONFIG_DIR = "/etc/tessera/kubeadm"         # where a real applier writes a node's --config


class KubernetesRuntime:
    kind: ClusterKind = "kubernetes"

    def __init__(self, state_root: Path, applier: KubernetesApplier | None = None, *,
                 image_repository: str = kubeadm.DEFAULT_IMAGE_REPOSITORY,
                 kubernetes_version: str = kubeadm.KUBERNETES_VERSION) -> None:
        self.state_root = state_root
        self.applier = applier or RecordingApplier(state_root)
        self.image_repository = image_repository
        self.kubernetes_version = kubernetes_version

    # --- lifecycle -----------------------------------------------------------------------------------------------
    async def start(self, spec: ClusterSpec) -> ClusterHandle:
        folder = self._folder(spec.cluster_id)
        plan = self._plan(spec, folder)
        if self._load(folder, "nodes.json") is None:
            documents = kubeadm.init_documents(spec, plan)
            await self._kubeadm(spec, folder, spec.controller, ["kubeadm", "init"], documents)
            await self.applier.apply(str(spec.cluster_id), _checked([jobs.namespace()]))
            self._save(folder, "nodes.json", {spec.controller.name: {"address": spec.controller.address}})
        return await self.set_nodes(spec, self._handle(spec, folder, plan))

    async def set_nodes(self, spec: ClusterSpec, handle: ClusterHandle) -> ClusterHandle:
        folder = self._folder(spec.cluster_id)
        plan = self._plan(spec, folder)
        known: dict = self._load(folder, "nodes.json") or {}
        wanted = {n.name: n for n in spec.nodes}
        for name in sorted(set(known) - set(wanted)):
            await self.applier.run(str(spec.cluster_id), spec.controller.name, ["kubectl", "delete", "node", name])
            await self.applier.run(str(spec.cluster_id), name, ["kubeadm", "reset", "--force"])
            del known[name]
        for node in spec.nodes[1:]:
            if node.name not in known:
                await self._kubeadm(spec, folder, node, ["kubeadm", "join"], [kubeadm.join_document(spec, node, plan)])
                known[node.name] = {"address": node.address}
        self._save(folder, "nodes.json", known)
        manifests = _checked(capi.manifests(spec, plan))
        (folder / "capi.yaml").write_text(yaml.safe_dump_all(manifests, sort_keys=False))
        return self._handle(spec, folder, plan)

    async def replace_node(self, spec: ClusterSpec, handle: ClusterHandle, node: ClusterNode) -> ClusterHandle:
        """A worker lost with its host joins again from its new slot: its old Node object is deleted, then a
        kubeadm join is recorded with its new address. The control-plane node cannot move: its etcd (the one
        member) went with the host."""
        if node.name == spec.controller.name:
            raise ClusterError(f"the control-plane node {node.name} was lost: its etcd (the cluster's only member) "
                               "went with it, so the cluster cannot be moved", permanent=True)
        folder = self._folder(spec.cluster_id)
        known: dict = self._load(folder, "nodes.json") or {}
        await self.applier.run(str(spec.cluster_id), spec.controller.name,
                               ["kubectl", "delete", "node", node.name, "--ignore-not-found"])
        await self._kubeadm(spec, folder, node, ["kubeadm", "join"],
                            [kubeadm.join_document(spec, node, self._plan(spec, folder))])
        known[node.name] = {"address": node.address}
        self._save(folder, "nodes.json", known)
        return await self.set_nodes(spec, handle)

    async def drain(self, handle: ClusterHandle, node: str, reason: str) -> None:
        folder = self._existing(handle)
        known = self._load(folder, "nodes.json") or {}
        if node not in known:
            raise ClusterError(f"no node {node} in the cluster", permanent=True)
        if known[node].get("cordoned"):
            return
        controller = next(iter(known))
        await self.applier.run(str(handle.cluster_id), controller, ["kubectl", "cordon", node])
        await self.applier.run(str(handle.cluster_id), controller, [
            "kubectl", "annotate", "node", node, "--overwrite", f"tessera.io/drain-reason={reason}"])
        known[node]["cordoned"] = True
        self._save(folder, "nodes.json", known)

    async def nodes(self, handle: ClusterHandle) -> list[NodeUse]:
        known = self._load(self._existing(handle), "nodes.json") or {}
        return [NodeUse(name, "drained" if n.get("cordoned") else "idle", 0, 0) for name, n in known.items()]

    async def stop(self, handle: ClusterHandle) -> None:
        """Reset every node and remove the cluster's state; only the append-only record of calls stays."""
        folder = self.state_root / str(handle.cluster_id)
        known = self._load(folder, "nodes.json") if folder.exists() else None
        for name in reversed(list(known or {})):
            await self.applier.run(str(handle.cluster_id), name, ["kubeadm", "reset", "--force"])
        for entry in folder.iterdir() if folder.exists() else ():
            if entry.is_dir():
                shutil.rmtree(entry)
            elif entry.name != CALLS:
                entry.unlink()

    # --- jobs ------------------------------------------------------------------------------------------------------
    async def submit(self, handle: ClusterHandle, job: JobSpec) -> str:
        folder = self._existing(handle)
        known: dict = self._load(folder, "jobs.json") or {}
        if str(job.job_id) in known:
            return known[str(job.job_id)]["external_id"]
        manifest = jobs.job_manifest(job)
        await self.applier.apply(str(handle.cluster_id), _checked([manifest]))
        external_id = f"{jobs.NAMESPACE}/{manifest['metadata']['name']}"
        known[str(job.job_id)] = {"external_id": external_id, "cancelled": False}
        self._save(folder, "jobs.json", known)
        return external_id

    async def job(self, handle: ClusterHandle, external_id: str) -> JobStatus:
        _, entry = self._job(handle, external_id)
        if entry["cancelled"]:
            return JobStatus("CANCELLED", message="recorded: deleted; no Kubernetes server")
        return JobStatus("PENDING", message=RECORDED)

    async def logs(self, handle: ClusterHandle, external_id: str, limit_bytes: int = 65536) -> str:
        self._job(handle, external_id)
        return ""                                   # nothing ran

    async def cancel(self, handle: ClusterHandle, external_id: str) -> None:
        job_id, entry = self._job(handle, external_id)
        if entry["cancelled"]:
            return
        namespace, name = external_id.split("/", 1)
        await self.applier.delete(str(handle.cluster_id), [("Job", name, namespace)])
        folder = self._existing(handle)
        known = self._load(folder, "jobs.json")
        known[job_id]["cancelled"] = True
        self._save(folder, "jobs.json", known)

    async def pending(self, handle: ClusterHandle) -> int:
        known = self._load(self._existing(handle), "jobs.json") or {}
        return sum(1 for entry in known.values() if not entry["cancelled"])

    # --- state -----------------------------------------------------------------------------------------------------
    def _folder(self, cluster_id) -> Path:
        folder = self.state_root / str(cluster_id)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return folder

    def _existing(self, handle: ClusterHandle) -> Path:
        folder = self.state_root / str(handle.cluster_id)
        if not (folder / "plan.json").exists():
            raise ClusterError(f"cluster {handle.cluster_id} is not started", permanent=True)
        return folder

    def _job(self, handle: ClusterHandle, external_id: str) -> tuple[str, dict]:
        known = self._load(self._existing(handle), "jobs.json") or {}
        for job_id, entry in known.items():
            if entry["external_id"] == external_id:
                return job_id, entry
        raise ClusterError(f"no job {external_id}", permanent=True)

    def _plan(self, spec: ClusterSpec, folder: Path) -> kubeadm.ClusterPlan:
        saved = self._load(folder, "plan.json")
        if saved:
            return kubeadm.ClusterPlan(**saved)
        key_pem, cert_pem = kubeadm.new_ca(spec.name)
        (folder / "pki").mkdir(exist_ok=True, mode=0o700)
        _write_private(folder / "pki" / "ca.key", key_pem)
        (folder / "pki" / "ca.crt").write_bytes(cert_pem)
        pods, services = kubeadm.choose_subnets([n.address for n in spec.nodes])
        plan = kubeadm.ClusterPlan(kubeadm.bootstrap_token(), kubeadm.ca_cert_hash(cert_pem), pods, services,
                                   self.kubernetes_version, self.image_repository)
        self._save(folder, "plan.json", dataclasses.asdict(plan))
        return plan

    async def _kubeadm(self, spec: ClusterSpec, folder: Path, node: ClusterNode, command: list[str],
                       documents: list[dict]) -> None:
        _checked(documents)
        (folder / "kubeadm").mkdir(exist_ok=True, mode=0o700)
        _write_private(folder / "kubeadm" / f"{node.name}.yaml", yaml.safe_dump_all(documents, sort_keys=False).encode())
        argv = [*command, "--config", f"{CONFIG_DIR}/{node.name}.yaml"]
        await self.applier.run(str(spec.cluster_id), node.name, argv, documents)

    def _handle(self, spec: ClusterSpec, folder: Path, plan: kubeadm.ClusterPlan) -> ClusterHandle:
        return ClusterHandle(
            cluster_id=spec.cluster_id, controller=kubeadm.endpoint(spec), api=f"unix:{folder / 'apiserver.sock'}",
            driver="recording",
            details={"state_dir": str(folder), "calls": str(folder / CALLS), "capi_manifests": str(folder / "capi.yaml"),
                     "kubernetes_version": plan.kubernetes_version, "pod_subnet": plan.pod_subnet,
                     "service_subnet": plan.service_subnet, "ca_cert_hash": plan.ca_cert_hash,
                     "nodes": [n.name for n in spec.nodes]})

    @staticmethod
    def _load(folder: Path, name: str) -> dict | None:
        path = folder / name
        return json.loads(path.read_text()) if path.exists() else None

    @staticmethod
    def _save(folder: Path, name: str, value: dict) -> None:
        tmp = folder / f".{name}.tmp"
        _write_private(tmp, json.dumps(value, indent=1).encode())
        tmp.replace(folder / name)              # a crash leaves the old file or the new one, never half of one


def _checked(documents: list[dict]) -> list[dict]:
    try:
        validate_all(documents)
    except ManifestError as exc:
        raise ClusterError(f"rendered a document the cluster would refuse: {exc}", permanent=True) from exc
    return documents


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
