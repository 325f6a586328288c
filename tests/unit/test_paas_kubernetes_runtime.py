"""The rendered Kubernetes runtime: what it records for each ClusterRuntime call, idempotently, and the state it
keeps per cluster (apart from every other cluster's)."""
from __future__ import annotations

import dataclasses
import inspect
import stat
import uuid

import pytest
import yaml

from services.paas.adapters.kubernetes.applier import RecordingApplier
from services.paas.adapters.kubernetes.runtime import RECORDED, KubernetesRuntime
from services.paas.adapters.kubernetes.schemas import validate_all
from services.paas.domain.runtime import ClusterError, ClusterNode, ClusterRuntime, ClusterSpec, JobSpec


def spec(n: int, name: str = "k8s", cluster_id: uuid.UUID | None = None) -> ClusterSpec:
    nodes = tuple(ClusterNode(f"{name}-{i}", uuid.uuid4(), f"10.0.0.{i + 2}", gpus=2) for i in range(n))
    return ClusterSpec(cluster_id or uuid.uuid4(), uuid.uuid4(), name, "kubernetes", nodes)


@pytest.fixture
def runtime(tmp_path) -> KubernetesRuntime:
    return KubernetesRuntime(tmp_path, RecordingApplier(tmp_path))


def test_the_runtime_keeps_the_cluster_runtime_signatures():
    methods = [n for n, f in vars(ClusterRuntime).items() if inspect.iscoroutinefunction(f)]
    assert len(methods) == 11 and KubernetesRuntime.kind == "kubernetes"
    for name in methods:
        assert inspect.signature(getattr(KubernetesRuntime, name)) == inspect.signature(getattr(ClusterRuntime, name))


def calls(runtime: KubernetesRuntime, cluster_id) -> list[dict]:
    return runtime.applier.calls(str(cluster_id))


async def test_start_records_init_then_joins_with_their_configs_and_is_idempotent(runtime, tmp_path):
    s = spec(3)
    handle = await runtime.start(s)
    assert handle.driver == "recording" and handle.controller == "10.0.0.2:6443"
    assert handle.api.startswith("unix:") and handle.details["pod_subnet"] == "100.64.0.0/16"
    runs = [c for c in calls(runtime, s.cluster_id) if c["call"] == "run"]
    assert [(c["node"], c["argv"][:2]) for c in runs] == [
        ("k8s-0", ["kubeadm", "init"]), ("k8s-1", ["kubeadm", "join"]), ("k8s-2", ["kubeadm", "join"])]
    assert runs[0]["argv"][-2:] == ["--config", "/etc/tessera/kubeadm/k8s-0.yaml"]
    assert [d["kind"] for d in runs[0]["documents"]] == ["InitConfiguration", "ClusterConfiguration"]
    pin = runs[1]["documents"][0]["discovery"]["bootstrapToken"]["caCertHashes"][0]
    assert pin == handle.details["ca_cert_hash"]
    folder = tmp_path / str(s.cluster_id)
    assert stat.S_IMODE((folder / "pki" / "ca.key").stat().st_mode) == 0o600
    validate_all(list(yaml.safe_load_all((folder / "capi.yaml").read_text())))

    before = len(calls(runtime, s.cluster_id))
    assert await runtime.start(s) == handle                      # a retry after a crash: nothing new
    assert len(calls(runtime, s.cluster_id)) == before


async def test_scaling_joins_new_nodes_and_resets_removed_ones(runtime):
    s = spec(3)
    handle = await runtime.start(s)
    grown = dataclasses.replace(s, nodes=(*s.nodes, ClusterNode("k8s-3", uuid.uuid4(), "10.0.0.9")))
    await runtime.set_nodes(grown, handle)
    shrunk = dataclasses.replace(s, nodes=(s.nodes[0], s.nodes[2], grown.nodes[3]))
    handle = await runtime.set_nodes(shrunk, handle)
    argvs = [(c["node"], c["argv"][:3]) for c in calls(runtime, s.cluster_id)[-3:]]
    assert argvs == [("k8s-3", ["kubeadm", "join", "--config"]), ("k8s-0", ["kubectl", "delete", "node"]),
                     ("k8s-1", ["kubeadm", "reset", "--force"])]
    assert handle.details["nodes"] == ["k8s-0", "k8s-2", "k8s-3"]
    assert [n.name for n in await runtime.nodes(handle)] == ["k8s-0", "k8s-2", "k8s-3"]


async def test_drain_cordons_once_and_the_node_reports_drained(runtime):
    s = spec(2)
    handle = await runtime.start(s)
    await runtime.drain(handle, "k8s-1", "scale in")
    await runtime.drain(handle, "k8s-1", "scale in")
    cordons = [c for c in calls(runtime, s.cluster_id) if c.get("argv", [None, None])[:2] == ["kubectl", "cordon"]]
    assert len(cordons) == 1 and cordons[0]["node"] == "k8s-0"        # kubectl runs on the control plane
    assert {n.name: n.state for n in await runtime.nodes(handle)} == {"k8s-0": "idle", "k8s-1": "drained"}
    with pytest.raises(ClusterError):
        await runtime.drain(handle, "nope", "x")


async def test_a_submitted_job_is_recorded_once_and_stays_pending_until_cancelled(runtime):
    s = spec(2)
    handle = await runtime.start(s)
    job = JobSpec(uuid.uuid4(), "train", ("python", "train.py"), gpus_per_task=2, image="nvcr.io/x/y:1")
    external = await runtime.submit(handle, job)
    assert await runtime.submit(handle, job) == external               # the job id is the idempotency key
    applies = [c for c in calls(runtime, s.cluster_id) if c["call"] == "apply" and c["documents"][0]["kind"] == "Job"]
    assert len(applies) == 1 and applies[0]["documents"][0]["metadata"]["labels"]["tessera.io/job-id"] == str(job.job_id)
    status = await runtime.job(handle, external)
    assert (status.state, status.message) == ("PENDING", RECORDED)
    assert await runtime.pending(handle) == 1 and await runtime.logs(handle, external) == ""
    await runtime.cancel(handle, external)
    await runtime.cancel(handle, external)
    assert [c["call"] for c in calls(runtime, s.cluster_id)].count("delete") == 1
    assert (await runtime.job(handle, external)).state == "CANCELLED" and await runtime.pending(handle) == 0
    with pytest.raises(ClusterError) as refused:
        await runtime.submit(handle, JobSpec(uuid.uuid4(), "no-image", ("true",)))
    assert refused.value.permanent


async def test_clusters_keep_apart_and_stop_leaves_only_the_record(runtime, tmp_path):
    a, b = spec(2, "alpha"), spec(2, "beta")
    ha, hb = await runtime.start(a), await runtime.start(b)
    assert ha.details["ca_cert_hash"] != hb.details["ca_cert_hash"]
    await runtime.stop(ha)
    await runtime.stop(ha)                                              # a stopped cluster is fine
    assert [p.name for p in (tmp_path / str(a.cluster_id)).iterdir()] == ["calls.jsonl"]
    resets = [c["node"] for c in calls(runtime, a.cluster_id) if c.get("argv", [])[:2] == ["kubeadm", "reset"]]
    assert resets == ["alpha-1", "alpha-0"]
    assert (await runtime.nodes(hb))[0].name == "beta-0"
    with pytest.raises(ClusterError):
        await runtime.nodes(ha)
