"""The spot market as NVIDIA Cloud Functions sees a provider's cluster, recorded: every call appends what a real
driver would run (the nvca-operator ``helm upgrade``, the ``kubectl`` label/cordon/drain per node, the NVCFBackend
patch of a maintenance mode) and what the control plane should then list (the ``clusterGroups`` entry) to an
append-only JSONL file, one object per intended call.

NVCF has no "push a capacity number" call: its cluster agent discovers GPUs from the nodes it may schedule on. So a
node is offered by labelling it schedulable for the agent (shared-cluster mode's ``nvca.nvcf.nvidia.io/schedule``)
and uncordoning it, and taken back by removing the label and cordoning it, then draining it after the grace when
the mode is ``cordon_and_drain``. The agent's own maintenance modes (feature flags ``CordonMaintenance`` and
``CordonAndDrainMaintenance``, mutually exclusive) act on the whole cluster: ``set_maintenance`` uses the first.

The cluster key is never written: commands carry ``$NVCF_CLUSTER_KEY`` for the real driver's environment.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.paas.domain.spot import RELEASE_BOUND_S, ReclaimMode

CHART = "oci://nvcr.io/nvidia/nvcf-byoc/nvca-operator"
NAMESPACE = "nvca-operator"
SCHEDULE_LABEL = "nvca.nvcf.nvidia.io/schedule"
OFFER_LABELS = ("tessera.io/spot-gpus", "tessera.io/spot-until")
MAINTENANCE_FLAG = "CordonMaintenance"
DRAIN_SLACK_S = int(RELEASE_BOUND_S)   # kubectl gives up on the drain then: the capacity is due back by then


@dataclass
class _Offered:
    gpu_model: str
    gpus: int
    until: float
    reclaiming: bool = False


@dataclass
class _Registration:
    name: str
    group: str
    region: str
    compute_platform: str
    authorized_nca_ids: tuple[str, ...]
    attributes: tuple[str, ...]
    cluster_id: str = field(init=False)

    def __post_init__(self) -> None:
        # stable across re-registration: NVCF's cluster name is immutable, so its id follows from it
        self.cluster_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.name}.nvcf.tessera"))


class RecordingNvcfProvider:
    """``SpotCapacityProvider`` that records. ``in_use(node_id, offered_gpus) -> GPUs`` simulates what spot
    workloads use of an offered node (default: nothing); set ``provider.in_use`` to change it."""

    def __init__(self, record: Path, *, clock: Callable[[], float] = time.time,
                 in_use: Callable[[str, int], int] | None = None, chart: str = CHART) -> None:
        self.record = record
        self.clock = clock
        self.in_use = in_use or (lambda _node, _gpus: 0)
        self.chart = chart
        self.registration: _Registration | None = None
        self.offered: dict[str, _Offered] = {}
        self.maintenance = False

    # --- the protocol --------------------------------------------------------------------------------------------
    async def register_cluster(self, name: str, group: str, region: str, compute_platform: str,
                               authorized_nca_ids: tuple[str, ...], attributes: tuple[str, ...]) -> None:
        if self.registration and self.registration.name != name:
            raise ValueError(f"registered as {self.registration.name!r}: an NVCF cluster's name is immutable")
        reg = _Registration(name, group, region, compute_platform, tuple(authorized_nca_ids), tuple(attributes))
        self.registration = reg
        self._write("register_cluster", commands=[self._helm_install(reg)], expect={"clusterGroups": [self._group()]})

    async def offer_nodes(self, node_ids: tuple[str, ...], gpu_model: str, gpus_per_node: int, until: float) -> None:
        self._registered()
        commands = []
        for node in node_ids:
            self.offered[node] = _Offered(gpu_model, gpus_per_node, until)
            commands += [["kubectl", "label", "node", node, "--overwrite", f"{SCHEDULE_LABEL}=true",
                          f"{OFFER_LABELS[0]}={gpus_per_node}", f"{OFFER_LABELS[1]}={int(until)}"],
                         ["kubectl", "uncordon", node]]
        self._write("offer_nodes", commands=commands, expect={"clusterGroups": [self._group()]})

    async def reclaim_nodes(self, node_ids: tuple[str, ...], grace_s: float, mode: ReclaimMode) -> None:
        self._registered()
        commands = []
        for node in node_ids:
            commands += [["kubectl", "label", "node", node, f"{SCHEDULE_LABEL}-", f"{OFFER_LABELS[0]}-",
                          f"{OFFER_LABELS[1]}-"], ["kubectl", "cordon", node]]
            if mode == "cordon_and_drain":
                commands.append(["kubectl", "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                                 f"--grace-period={int(grace_s)}", f"--timeout={int(grace_s) + DRAIN_SLACK_S}s"])
            if node in self.offered:
                self.offered[node].reclaiming = True
        self._write("reclaim_nodes", commands=commands, mode=mode, grace_s=grace_s)

    def released(self, node_ids: tuple[str, ...]) -> None:
        """The drains finished (a real driver sees the nodes empty): the nodes are no longer spot's."""
        for node in node_ids:
            self.offered.pop(node, None)

    async def report_usage(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for node, offer in sorted(self.offered.items()):
            line = out.setdefault(offer.gpu_model, {"offered": 0, "in_use": 0})
            line["offered"] += 0 if offer.reclaiming else offer.gpus
            line["in_use"] += min(offer.gpus, max(0, self.in_use(node, offer.gpus)))
        return out

    async def set_maintenance(self, on: bool) -> None:
        reg = self._registered()
        self.maintenance = on
        patch = {"spec": {"overrides": {"featureGate": {"values": [MAINTENANCE_FLAG] if on else []}}}}
        self._write("set_maintenance", on=on, commands=[[
            "kubectl", "patch", "nvcfbackends.nvcf.nvidia.io", "-n", NAMESPACE, reg.name, "--type=merge",
            "-p", json.dumps(patch, separators=(",", ":"))]])

    async def deregister(self) -> None:
        if self.registration is None:
            return
        commands = [["kubectl", "label", "node", node, f"{SCHEDULE_LABEL}-"] for node in sorted(self.offered)]
        commands.append(["helm", "uninstall", "nvca-operator", "-n", NAMESPACE, "--wait"])
        self.registration, self.offered = None, {}
        self._write("deregister", commands=commands, expect={"clusterGroups": []})

    # --- rendering -----------------------------------------------------------------------------------------------
    def _helm_install(self, reg: _Registration) -> list[str]:
        sets = {"ngcConfig.serviceKey": "$NVCF_CLUSTER_KEY", "ncaID": reg.authorized_nca_ids[0] if reg.authorized_nca_ids
                else "", "clusterID": reg.cluster_id, "ngcConfig.clusterSource": "helm-managed",
                "helmManaged.cloudProvider": reg.compute_platform, "helmManaged.clusterRegion": reg.region,
                "helmManaged.clusterGroupName": reg.group}
        argv = ["helm", "upgrade", "nvca-operator", self.chart, "-n", NAMESPACE, "--create-namespace", "-i",
                "--reset-values", "--wait"]
        for key, value in sets.items():
            argv += ["--set", f"{key}={value}"]
        return argv

    def _group(self) -> dict:
        """The ``GET /v2/nvcf/clusterGroups`` entry the control plane should list once the agent has seen the
        nodes: one GPU per model offered, its instance types the offered shapes."""
        reg = self._registered()
        shapes: dict[str, set[int]] = {}
        for offer in self.offered.values():
            if not offer.reclaiming:
                shapes.setdefault(offer.gpu_model, set()).add(offer.gpus)
        gpus = [{"name": model, "instanceTypes": [
            {"name": f"{reg.compute_platform}.GPU.{model}_{n}x", "description": f"{n} {model}", "default": i == 0}
            for i, n in enumerate(sorted(sizes))]} for model, sizes in sorted(shapes.items())]
        return {"name": reg.group, "authorizedNcaIds": list(reg.authorized_nca_ids), "gpus": gpus,
                "clusters": [{"id": reg.cluster_id, "name": reg.name, "region": reg.region,
                              "attributes": list(reg.attributes)}]}

    def _registered(self) -> _Registration:
        if self.registration is None:
            raise RuntimeError("register_cluster first: NVCF knows no unregistered cluster")
        return self.registration

    def _write(self, call: str, **fields) -> None:
        self.record.parent.mkdir(parents=True, exist_ok=True)
        with self.record.open("a") as f:
            f.write(json.dumps({"at": self.clock(), "call": call, **fields}, sort_keys=True) + "\n")
