"""Cluster API manifests for a tenant cluster on hosts that already exist (the tenant's allocations): the
bring-your-own-host infrastructure provider (ByoCluster, ByoMachineTemplate) under the core Cluster, a
KubeadmControlPlane of one replica on ``nodes[0]`` and a MachineDeployment of the other nodes. Applied to a
management cluster they reproduce what the kubeadm configurations do by hand; which host becomes which machine
follows the ``tessera.io/cluster`` and ``tessera.io/role`` labels the hosts' agents register with."""
from __future__ import annotations

from services.paas.adapters.kubernetes.kubeadm import API_PORT, CRI_SOCKET, ClusterPlan
from services.paas.domain.runtime import ClusterSpec

CLUSTER_API = "cluster.x-k8s.io/v1beta1"
CONTROL_PLANE_API = "controlplane.cluster.x-k8s.io/v1beta1"
BOOTSTRAP_API = "bootstrap.cluster.x-k8s.io/v1beta1"
BYOH_API = "infrastructure.cluster.x-k8s.io/v1beta1"
NAMESPACE = "tessera-clusters"


def _meta(name: str, spec: ClusterSpec) -> dict:
    return {"name": name, "namespace": NAMESPACE,
            "labels": {"cluster.x-k8s.io/cluster-name": spec.name, "tessera.io/cluster-id": str(spec.cluster_id)}}


def _ref(api: str, kind: str, name: str) -> dict:
    return {"apiVersion": api, "kind": kind, "name": name, "namespace": NAMESPACE}


def _byoh_template(spec: ClusterSpec, role: str) -> dict:
    return {"apiVersion": BYOH_API, "kind": "ByoMachineTemplate", "metadata": _meta(f"{spec.name}-{role}", spec),
            "spec": {"template": {"spec": {"selector": {"matchLabels": {
                "tessera.io/cluster": spec.name, "tessera.io/role": role}}}}}}


def _node_registration() -> dict:
    # Cluster API's v1beta1 kubeadm types keep kubeletExtraArgs as a map (kubeadm v1beta4 made it a list)
    return {"criSocket": CRI_SOCKET, "kubeletExtraArgs": {"node-labels": "tessera.io/managed=capi"}}


def manifests(spec: ClusterSpec, plan: ClusterPlan) -> list[dict]:
    """Cluster, ByoCluster, two ByoMachineTemplates, KubeadmControlPlane, KubeadmConfigTemplate and
    MachineDeployment, in the order a management cluster accepts them."""
    cp = spec.controller
    name, workers = spec.name, len(spec.nodes) - 1
    version = plan.kubernetes_version
    cluster = {"apiVersion": CLUSTER_API, "kind": "Cluster", "metadata": _meta(name, spec), "spec": {
        "clusterNetwork": {"pods": {"cidrBlocks": [plan.pod_subnet]},
                           "services": {"cidrBlocks": [plan.service_subnet]}},
        "controlPlaneRef": _ref(CONTROL_PLANE_API, "KubeadmControlPlane", f"{name}-control-plane"),
        "infrastructureRef": _ref(BYOH_API, "ByoCluster", name)}}
    byo_cluster = {"apiVersion": BYOH_API, "kind": "ByoCluster", "metadata": _meta(name, spec), "spec": {
        "controlPlaneEndpoint": {"host": cp.address, "port": API_PORT},
        "bundleLookupBaseRegistry": plan.image_repository}}
    control_plane = {"apiVersion": CONTROL_PLANE_API, "kind": "KubeadmControlPlane",
                     "metadata": _meta(f"{name}-control-plane", spec), "spec": {
                         "replicas": 1, "version": version,
                         "machineTemplate": {"infrastructureRef": _ref(BYOH_API, "ByoMachineTemplate",
                                                                       f"{name}-control-plane")},
                         "kubeadmConfigSpec": {
                             "clusterConfiguration": {"imageRepository": plan.image_repository,
                                                      "apiServer": {"certSANs": [cp.address, cp.name]}},
                             "initConfiguration": {"nodeRegistration": _node_registration()},
                             "joinConfiguration": {"nodeRegistration": _node_registration()}}}}
    config_template = {"apiVersion": BOOTSTRAP_API, "kind": "KubeadmConfigTemplate",
                       "metadata": _meta(f"{name}-workers", spec), "spec": {"template": {"spec": {
                           "joinConfiguration": {"nodeRegistration": _node_registration()}}}}}
    deployment = {"apiVersion": CLUSTER_API, "kind": "MachineDeployment", "metadata": _meta(f"{name}-workers", spec),
                  "spec": {"clusterName": name, "replicas": workers,
                           "selector": {"matchLabels": {"cluster.x-k8s.io/cluster-name": name}},
                           "template": {"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": name}}, "spec": {
                               "clusterName": name, "version": version,
                               "bootstrap": {"configRef": _ref(BOOTSTRAP_API, "KubeadmConfigTemplate",
                                                               f"{name}-workers")},
                               "infrastructureRef": _ref(BYOH_API, "ByoMachineTemplate", f"{name}-worker")}}}}
    return [cluster, byo_cluster, _byoh_template(spec, "control-plane"), _byoh_template(spec, "worker"),
            control_plane, config_template, deployment]
