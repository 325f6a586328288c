"""Kubernetes rendering: kubeadm configurations, Cluster API manifests and Jobs, all validated offline, and the
validators refusing what a cluster would refuse."""
from __future__ import annotations

import copy
import shutil
import subprocess
import uuid

import pytest

from services.paas.adapters.kubernetes import capi, jobs, kubeadm
from services.paas.adapters.kubernetes.schemas import ManifestError, validate, validate_all
from services.paas.domain.runtime import ClusterError, ClusterNode, ClusterSpec, JobSpec


def cluster(n: int = 3, base: str = "10.0.0.") -> ClusterSpec:
    nodes = tuple(ClusterNode(f"k8s-{i}", uuid.uuid4(), f"{base}{i + 2}", gpus=2) for i in range(n))
    return ClusterSpec(uuid.uuid4(), uuid.uuid4(), "k8s", "kubernetes", nodes)


@pytest.fixture(scope="module")
def ca() -> tuple[bytes, bytes]:
    return kubeadm.new_ca("k8s")


@pytest.fixture
def plan(ca) -> kubeadm.ClusterPlan:
    return kubeadm.ClusterPlan(kubeadm.bootstrap_token(), kubeadm.ca_cert_hash(ca[1]), "100.64.0.0/16", "100.65.0.0/16",
                               image_repository="mirror.tenant.internal:5000/k8s")


def job(**over) -> JobSpec:
    fields = {"job_id": uuid.uuid4(), "name": "Train GPT!", "command": ("python", "train.py"), "tasks": 2,
              "gpus_per_task": 1, "env": {"EPOCHS": "3"}, "image": "nvcr.io/nvidia/pytorch:24.05-py3"}
    return JobSpec(**{**fields, **over})


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl pins the CA the way kubeadm's docs do")
def test_the_ca_hash_is_kubeadms_pin_over_the_public_key_info(ca, tmp_path):
    (tmp_path / "ca.crt").write_bytes(ca[1])
    pubkey = subprocess.run(["openssl", "x509", "-pubkey", "-noout", "-in", str(tmp_path / "ca.crt")],
                            capture_output=True, check=True).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=pubkey, capture_output=True,
                         check=True).stdout
    digest = subprocess.run(["openssl", "dgst", "-sha256", "-hex"], input=der, capture_output=True, check=True).stdout
    assert kubeadm.ca_cert_hash(ca[1]) == "sha256:" + digest.decode().split()[-1]


def test_init_and_join_configurations_validate_and_pin_the_control_plane(plan):
    spec = cluster()
    init, conf = kubeadm.init_documents(spec, plan)
    joins = [kubeadm.join_document(spec, node, plan) for node in spec.nodes[1:]]
    validate_all([init, conf, *joins])
    assert conf["controlPlaneEndpoint"] == "10.0.0.2:6443" and conf["imageRepository"].startswith("mirror.")
    assert "10.0.0.2" in conf["apiServer"]["certSANs"] and init["localAPIEndpoint"]["advertiseAddress"] == "10.0.0.2"
    assert init["bootstrapTokens"][0]["token"] == plan.token
    discovery = joins[0]["discovery"]["bootstrapToken"]
    assert discovery == {"token": plan.token, "apiServerEndpoint": "10.0.0.2:6443", "caCertHashes": [plan.ca_cert_hash]}
    assert [j["nodeRegistration"]["name"] for j in joins] == ["k8s-1", "k8s-2"]


def test_pod_and_service_subnets_clear_the_tenants_network():
    assert kubeadm.choose_subnets(["10.0.0.2"]) == ("100.64.0.0/16", "100.65.0.0/16")
    assert kubeadm.choose_subnets(["100.64.3.2"]) == ("172.16.0.0/16", "172.17.0.0/16")
    assert kubeadm.choose_subnets(["10.0.0.2"], tenant_cidrs=("100.64.0.0/10", "172.16.0.0/12")) == (
        "192.168.0.0/17", "192.168.128.0/17")
    with pytest.raises(ValueError):
        kubeadm.choose_subnets(["100.64.0.1", "172.16.0.1", "192.168.0.1"])


def test_a_broken_kubeadm_configuration_is_refused(plan):
    spec = cluster()
    good = kubeadm.join_document(spec, spec.nodes[1], plan)
    for path, value in ((("discovery", "bootstrapToken", "caCertHashes"), ["sha256:nothex"]),
                        (("discovery", "bootstrapToken", "token"), "short.token"),
                        (("nodeRegistration", "kubeletExtraArgs"), {"node-ip": "10.0.0.3"}),   # v1beta4 takes a list
                        (("apiVersion",), "kubeadm.k8s.io/v1beta3")):
        broken = copy.deepcopy(good)
        target = broken
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(ManifestError):
            validate(broken)
    broken = copy.deepcopy(good)
    broken["nodeRegistration"]["criSockett"] = "typo"            # kubeadm decodes strictly
    with pytest.raises(ManifestError, match="criSockett"):
        validate(broken)


def test_cluster_api_manifests_for_existing_hosts_validate_and_refer_to_each_other(plan):
    spec = cluster(4)
    docs = capi.manifests(spec, plan)
    validate_all(docs)
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Cluster", "ByoCluster", "ByoMachineTemplate", "KubeadmControlPlane",
                          "KubeadmConfigTemplate", "MachineDeployment"}
    assert kinds["Cluster"]["spec"]["controlPlaneRef"]["name"] == kinds["KubeadmControlPlane"]["metadata"]["name"]
    assert kinds["ByoCluster"]["spec"]["controlPlaneEndpoint"] == {"host": "10.0.0.2", "port": 6443}
    assert kinds["MachineDeployment"]["spec"]["replicas"] == 3
    broken = copy.deepcopy(kinds["KubeadmControlPlane"])
    del broken["spec"]["version"]
    with pytest.raises(ManifestError, match="version"):
        validate(broken)


def test_a_job_renders_as_an_unprivileged_batch_job_with_its_gpus():
    manifest = jobs.job_manifest(job())
    validate_all([jobs.namespace(), manifest])
    pod = manifest["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert container["securityContext"]["privileged"] is False and pod["restartPolicy"] == "Never"
    assert manifest["spec"]["activeDeadlineSeconds"] == 3600 and manifest["spec"]["completionMode"] == "Indexed"
    assert container["env"] == [{"name": "EPOCHS", "value": "3"}]
    assert manifest["metadata"]["name"].startswith("train-gpt-") and len(manifest["metadata"]["name"]) <= 51


def test_a_job_kubernetes_would_refuse_is_refused_before_it_leaves():
    with pytest.raises(ClusterError) as missing:
        jobs.job_manifest(job(image=None))
    assert missing.value.permanent
    with pytest.raises(ClusterError, match="environment"):
        jobs.job_manifest(job(env={"1BAD": "x"}))
    broken = jobs.job_manifest(job())
    broken["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = {"n": 1}
    with pytest.raises(ManifestError):
        validate(broken)
    with pytest.raises(ManifestError, match="no schema"):
        validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
