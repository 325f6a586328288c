"""kubeadm ``v1beta4`` configurations for a tenant cluster: InitConfiguration and ClusterConfiguration for the
first node (the control plane), a JoinConfiguration for every other node.

Tessera makes the cluster's CA itself (``new_ca``) and puts it in place (``/etc/kubernetes/pki/ca.{crt,key}``)
before ``kubeadm init``, which then uses it: so the join configurations can pin the CA by its public-key hash
(``caCertHashes``) before the control plane exists, and the nodes never trust a server on first use.
"""
from __future__ import annotations

import datetime
import hashlib
import ipaddress
import secrets
import string
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.paas.domain.runtime import ClusterNode, ClusterSpec

API_VERSION = "kubeadm.k8s.io/v1beta4"
KUBERNETES_VERSION = "v1.32.4"              # the client in the image; the validators' schemas are pinned to it
API_PORT = 6443
CRI_SOCKET = "unix:///run/containerd/containerd.sock"
DEFAULT_IMAGE_REPOSITORY = "registry.k8s.io"
# (pods, services) candidates, first that clears the tenant's network: tenant networks come from 10.0.0.0/8,
# so the shared address space (RFC 6598) is tried first.
SUBNET_CANDIDATES = (("100.64.0.0/16", "100.65.0.0/16"), ("172.16.0.0/16", "172.17.0.0/16"),
                     ("192.168.0.0/17", "192.168.128.0/17"))
TENANT_PREFIX = 16                          # a node's address says its network is at most this wide: avoid all of it
_TOKEN_CHARS = string.ascii_lowercase + string.digits


@dataclass(frozen=True)
class ClusterPlan:
    """What every configuration of one cluster shares; kept in the cluster's state so a retry renders the same."""

    token: str                              # bootstrap token "[a-z0-9]{6}.[a-z0-9]{16}"
    ca_cert_hash: str                       # "sha256:<hex of the CA's SubjectPublicKeyInfo>"
    pod_subnet: str
    service_subnet: str
    kubernetes_version: str = KUBERNETES_VERSION
    image_repository: str = DEFAULT_IMAGE_REPOSITORY


def bootstrap_token() -> str:
    pick = secrets.choice
    return "".join(pick(_TOKEN_CHARS) for _ in range(6)) + "." + "".join(pick(_TOKEN_CHARS) for _ in range(16))


def new_ca(cluster_name: str) -> tuple[bytes, bytes]:
    """A fresh CA for one cluster: (private key PEM, certificate PEM), ten years, ECDSA P-256."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes"),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, cluster_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=True, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def ca_cert_hash(cert_pem: bytes) -> str:
    """kubeadm's CA pin: SHA-256 over the DER bytes of the certificate's SubjectPublicKeyInfo."""
    spki = x509.load_pem_x509_certificate(cert_pem).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def choose_subnets(addresses: list[str], tenant_cidrs: tuple[str, ...] = ()) -> tuple[str, str]:
    """The first (pods, services) pair that overlaps neither the tenant's networks (``tenant_cidrs`` when
    known, else the /16 around each node's address) nor each other."""
    taken = [ipaddress.ip_network(c, strict=False) for c in tenant_cidrs]
    taken += [ipaddress.ip_network(f"{a}/{TENANT_PREFIX}", strict=False) for a in addresses]
    for pods, services in SUBNET_CANDIDATES:
        nets = (ipaddress.ip_network(pods), ipaddress.ip_network(services))
        if not any(n.overlaps(t) for n in nets for t in taken):
            return pods, services
    raise ValueError(f"no pod/service subnets clear of the tenant's networks {[str(t) for t in taken]}")


def endpoint(spec: ClusterSpec) -> str:
    return f"{spec.controller.address}:{API_PORT}"


def _registration(node: ClusterNode, control_plane: bool) -> dict:
    args = [{"name": "node-ip", "value": node.address},
            {"name": "node-labels", "value": f"tessera.io/gpus={node.gpus}"}]
    taints = [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}] if control_plane else []
    return {"name": node.name, "criSocket": CRI_SOCKET, "taints": taints, "kubeletExtraArgs": args}


def init_documents(spec: ClusterSpec, plan: ClusterPlan) -> list[dict]:
    """InitConfiguration + ClusterConfiguration for ``nodes[0]``. A one-node cluster keeps its control plane
    schedulable (no taint): it is the only node there is."""
    cp = spec.controller
    registration = _registration(cp, control_plane=len(spec.nodes) > 1)
    init = {"apiVersion": API_VERSION, "kind": "InitConfiguration",
            "bootstrapTokens": [{"token": plan.token, "ttl": "24h0m0s", "usages": ["signing", "authentication"],
                                 "groups": ["system:bootstrappers:kubeadm:default-node-token"]}],
            "nodeRegistration": registration,
            "localAPIEndpoint": {"advertiseAddress": cp.address, "bindPort": API_PORT}}
    cluster = {"apiVersion": API_VERSION, "kind": "ClusterConfiguration", "clusterName": spec.name,
               "kubernetesVersion": plan.kubernetes_version, "controlPlaneEndpoint": endpoint(spec),
               "imageRepository": plan.image_repository, "certificatesDir": "/etc/kubernetes/pki",
               "networking": {"podSubnet": plan.pod_subnet, "serviceSubnet": plan.service_subnet,
                              "dnsDomain": "cluster.local"},
               "apiServer": {"certSANs": [cp.address, cp.name, "127.0.0.1"],
                             "extraArgs": [{"name": "profiling", "value": "false"}]},
               "etcd": {"local": {"dataDir": "/var/lib/etcd"}}}
    return [init, cluster]


def join_document(spec: ClusterSpec, node: ClusterNode, plan: ClusterPlan) -> dict:
    return {"apiVersion": API_VERSION, "kind": "JoinConfiguration",
            "discovery": {"bootstrapToken": {"token": plan.token, "apiServerEndpoint": endpoint(spec),
                                             "caCertHashes": [plan.ca_cert_hash]}},
            "nodeRegistration": _registration(node, control_plane=False)}
