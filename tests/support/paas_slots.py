"""A tenant's network of namespace slots for the cluster drivers' tests: a bridge in a namespace of its own and one
slot namespace per node, each with ``eth0`` on the bridge and an address on the tenant's subnet (what the
node-agent's kernel dataplane makes for an allocation, without the rest of the platform). Needs root."""
from __future__ import annotations

import subprocess
import sys
import uuid

from services.paas.domain.runtime import ClusterKind, ClusterNode, ClusterSpec


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def tcp_connects(netns: str, address: str, port: int) -> bool:
    """A TCP connection from inside ``netns`` is accepted (a refusal or no answer in 2 s: False)."""
    code = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()"
    return subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code, address, str(port)],
                          capture_output=True, timeout=30).returncode == 0


class Tenant:
    """A tenant's network: a bridge (in a namespace of its own) and one slot namespace per node, ``eth0`` each,
    addressed ``<subnet>.<first + i>``."""

    def __init__(self, subnet: str, nodes: int, first: int = 1) -> None:
        tag = uuid.uuid4().hex[:8]
        self.fabric = f"tf-{tag}"
        self.slots = [f"ts-{tag}-{uuid.uuid4().hex[:12]}" for _ in range(nodes)]
        self.addresses = [f"{subnet}.{first + i}" for i in range(nodes)]

    def build(self) -> Tenant:
        try:
            ip("netns", "add", self.fabric)
            ip("-n", self.fabric, "link", "add", "name", "tb", "type", "bridge")
            ip("-n", self.fabric, "link", "set", "tb", "up")
            for i, (ns, addr) in enumerate(zip(self.slots, self.addresses)):
                add_slot(self.fabric, ns, f"p{i}", addr)
        except Exception:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        for ns in [*self.slots, self.fabric]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    def spec(self, name: str, kind: ClusterKind) -> ClusterSpec:
        """A cluster of every slot, one GPU, one CPU and 512 MB each."""
        nodes = tuple(ClusterNode(name=f"{name}-{i}", allocation_id=uuid.uuid4(), address=addr, netns=ns, gpus=1,
                                  cpus=1, memory_mb=512) for i, (ns, addr) in enumerate(zip(self.slots, self.addresses)))
        return ClusterSpec(cluster_id=uuid.uuid4(), tenant_id=uuid.uuid4(), name=name, kind=kind, nodes=nodes)


def add_slot(fabric: str, ns: str, port: str, address: str) -> None:
    """A slot namespace ``ns`` on the fabric's bridge ``tb`` through port ``port``, holding ``address``/24."""
    ip("netns", "add", ns)
    ip("-n", fabric, "link", "add", "name", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("-n", fabric, "link", "set", port, "master", "tb", "up")
    ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
    ip("-n", ns, "link", "set", "eth0", "up")
    ip("-n", ns, "link", "set", "lo", "up")
