"""Offline validation of everything the Kubernetes driver renders, before anything is recorded or applied.

Core kinds (Namespace, Job, ConfigMap…) go through ``kubernetes-validate``'s bundled OpenAPI schemas of a pinned
Kubernetes release, strictly (an unknown field is an error, as ``kubectl apply --validate=strict`` makes it).
kubeadm's configuration types and the Cluster API kinds have no schema there: the ones below are written from the
upstream Go types (kubeadm ``v1beta4``, Cluster API ``v1beta1``, BYOH ``v1beta1``), with their required fields and
the fields this driver uses; kubeadm's objects are closed (kubeadm decodes its configuration strictly).
"""
from __future__ import annotations

import jsonschema
import kubernetes_validate

KUBERNETES_SCHEMA_VERSION = "1.32.0"


class ManifestError(ValueError):
    """A rendered document that would be refused."""


STR = {"type": "string", "minLength": 1}
INT = {"type": "integer", "minimum": 0}
STRS = {"type": "array", "items": STR}
ARGS = {"type": "array", "items": {"type": "object", "required": ["name", "value"], "additionalProperties": False,
                                   "properties": {"name": STR, "value": {"type": "string"}}}}
ENDPOINT = {"type": "string", "pattern": r"^[A-Za-z0-9.:\[\]-]+:[0-9]{1,5}$"}
CA_HASH = {"type": "string", "pattern": r"^sha256:[0-9a-f]{64}$"}
TOKEN = {"type": "string", "pattern": r"^[a-z0-9]{6}\.[a-z0-9]{16}$"}


def obj(required: dict, optional: dict | None = None, closed: bool = True) -> dict:
    return {"type": "object", "required": sorted(required), "properties": {**required, **(optional or {})},
            "additionalProperties": not closed}


def top(api_version: str, kind: str, required: dict, optional: dict | None = None, closed: bool = True) -> dict:
    head = {"apiVersion": {"const": api_version}, "kind": {"const": kind}}
    return obj({**head, **required}, optional, closed)


TAINT = obj({"key": STR, "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]}}, {"value": STR})
REGISTRATION = obj({"name": STR, "criSocket": STR},
                   {"taints": {"type": "array", "items": TAINT}, "kubeletExtraArgs": ARGS, "ignorePreflightErrors": STRS})
KUBEADM_API = "kubeadm.k8s.io/v1beta4"
KUBEADM = {
    "InitConfiguration": top(KUBEADM_API, "InitConfiguration", {
        "nodeRegistration": REGISTRATION,
        "localAPIEndpoint": obj({"advertiseAddress": STR}, {"bindPort": INT})}, {
        "bootstrapTokens": {"type": "array", "minItems": 1, "items": obj(
            {"token": TOKEN}, {"ttl": STR, "usages": STRS, "groups": STRS, "description": STR})}}),
    "ClusterConfiguration": top(KUBEADM_API, "ClusterConfiguration", {
        "kubernetesVersion": {"type": "string", "pattern": r"^v[0-9]+\.[0-9]+\.[0-9]+$"},
        "controlPlaneEndpoint": ENDPOINT,
        "networking": obj({"podSubnet": STR, "serviceSubnet": STR}, {"dnsDomain": STR})}, {
        "clusterName": STR, "imageRepository": STR, "certificatesDir": STR,
        "apiServer": obj({}, {"certSANs": STRS, "extraArgs": ARGS}),
        "etcd": obj({"local": obj({"dataDir": STR})})}),
    "JoinConfiguration": top(KUBEADM_API, "JoinConfiguration", {
        "discovery": obj({"bootstrapToken": obj({"token": TOKEN, "apiServerEndpoint": ENDPOINT,
                                                 "caCertHashes": {**STRS, "minItems": 1, "items": CA_HASH}},
                                                {"unsafeSkipCAVerification": {"const": False}})}),
        "nodeRegistration": REGISTRATION}, {"controlPlane": obj({}, {"certificateKey": STR})}),
}

META = obj({"name": STR}, {"namespace": STR, "labels": {"type": "object"}}, closed=False)
REF = obj({"apiVersion": STR, "kind": STR, "name": STR}, {"namespace": STR})
CAPI_API, CP_API = "cluster.x-k8s.io/v1beta1", "controlplane.cluster.x-k8s.io/v1beta1"
BOOT_API, BYOH_API = "bootstrap.cluster.x-k8s.io/v1beta1", "infrastructure.cluster.x-k8s.io/v1beta1"
KUBEADM_SPEC = obj({}, {"clusterConfiguration": {"type": "object"}, "initConfiguration": {"type": "object"},
                        "joinConfiguration": {"type": "object"}}, closed=False)
CIDRS = obj({"cidrBlocks": {**STRS, "minItems": 1}})
CAPI = {
    (CAPI_API, "Cluster"): top(CAPI_API, "Cluster", {"metadata": META, "spec": obj({}, {
        "clusterNetwork": obj({}, {"pods": CIDRS, "services": CIDRS, "serviceDomain": STR}),
        "controlPlaneRef": REF, "infrastructureRef": REF, "paused": {"type": "boolean"}})}),
    (BYOH_API, "ByoCluster"): top(BYOH_API, "ByoCluster", {"metadata": META, "spec": obj({
        "controlPlaneEndpoint": obj({"host": STR, "port": INT})}, {"bundleLookupBaseRegistry": STR})}),
    (BYOH_API, "ByoMachineTemplate"): top(BYOH_API, "ByoMachineTemplate", {"metadata": META, "spec": obj({
        "template": obj({"spec": obj({}, {"selector": {"type": "object"}, "installerRef": REF})})})}),
    (CP_API, "KubeadmControlPlane"): top(CP_API, "KubeadmControlPlane", {"metadata": META, "spec": obj({
        "version": STR, "machineTemplate": obj({"infrastructureRef": REF}, {"metadata": {"type": "object"}}),
        "kubeadmConfigSpec": KUBEADM_SPEC}, {"replicas": {"type": "integer", "minimum": 1}})}),
    (BOOT_API, "KubeadmConfigTemplate"): top(BOOT_API, "KubeadmConfigTemplate", {"metadata": META, "spec": obj({
        "template": obj({"spec": KUBEADM_SPEC})})}),
    (CAPI_API, "MachineDeployment"): top(CAPI_API, "MachineDeployment", {"metadata": META, "spec": obj({
        "clusterName": STR, "template": obj({"spec": obj({
            "clusterName": STR, "bootstrap": obj({"configRef": REF}), "infrastructureRef": REF}, {"version": STR},
            closed=False)}, {"metadata": {"type": "object"}})},
        {"replicas": INT, "selector": {"type": "object"}}, closed=False)}),
}
SCHEMAS = {**{(KUBEADM_API, kind): s for kind, s in KUBEADM.items()}, **CAPI}


def validate(document: dict) -> None:
    """Raise ManifestError naming the document and the first problem; return None when it would be accepted."""
    key = (document.get("apiVersion"), document.get("kind"))
    what = f"{key[1]} {document.get('metadata', {}).get('name', '')}".strip()
    schema = SCHEMAS.get(key)
    if schema is not None:
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(document))
        if error is not None:
            where = "/".join(map(str, error.absolute_path)) or "(top)"
            raise ManifestError(f"{what}: {where}: {error.message}")
        return
    try:
        kubernetes_validate.validate(document, KUBERNETES_SCHEMA_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        raise ManifestError(f"{what}: no schema for {key[0]} {key[1]}: refused rather than applied blind") from None
    except kubernetes_validate.ValidationError as exc:
        raise ManifestError(f"{what}: {exc.message}") from None


def validate_all(documents: list[dict]) -> None:
    for document in documents:
        validate(document)
