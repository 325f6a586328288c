"""Guest ports: a VM's tap (made by its hypervisor in the hypervisor's namespace) plugged by the node's dataplane
into the tenant bridge of a node living in another namespace (the lab), guarded by the same anti-spoof rules,
and reconciled without noise while its VM is not running. A persistent tap stands in for QEMU's."""
from __future__ import annotations

import random
import subprocess
import uuid

import pytest

from services.network.contracts import NetworkSnapshot, SlotAttachment, TenantNetworks
from services.node_agent.adapters.dataplane import KernelDataplane, probe
from services.node_agent.adapters.dataplane.kernel import Kernel
from services.node_agent.adapters.dataplane.lab import UNDERLAY_DEV, Lab, is_root
from services.node_agent.domain.dataplane.names import bridge_name, node_tag, slot_port_name

pytestmark = pytest.mark.skipif(not is_root(), reason="kernel dataplane tests need root (namespaces, taps)")


@pytest.fixture(scope="module", autouse=True)
async def clean_streams():
    """No bus here (the package's fixture would purge the streams)."""
    yield


@pytest.fixture
def node():
    lab = Lab(1, dataplanes=False).build()
    dp = KernelDataplane(Kernel(node_tag(lab.node_ids[0]), lab.node_ns[0], UNDERLAY_DEV), guest_ports=True)
    lab.dataplanes.append(dp)
    yield lab, dp
    lab.destroy()


def tap(name: str, where: str | None = None) -> None:
    """A tap like the one libvirt makes for a guest NIC (persistent here: no QEMU holds it)."""
    subprocess.run((["ip", "-n", where] if where else ["ip"]) + ["tuntap", "add", "mode", "tap", "name", name], check=True)


def link(name: str, ns: str | None) -> str:
    return probe.run(None, *(["ip", "-n", ns] if ns else ["ip"]), "-o", "link", "show", "dev", name).stdout


def tenant_and_attachment() -> tuple[TenantNetworks, SlotAttachment]:
    net = NetworkSnapshot(network_id=uuid.uuid4(), name="n", vni=random.randint(1, 16_000_000), cidr="10.20.0.0/24",
                          gateway_ip="10.20.0.1", vrf_table=1, rules=[])
    att = SlotAttachment(attachment_id=uuid.uuid4(), allocation_id=uuid.uuid4(), network_id=net.network_id,
                         ip_address="10.20.0.5", prefix_len=24, mac_address="02:00:00:00:00:05")
    return TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[net]), att


def test_a_guest_tap_is_moved_into_the_node_and_plugged_into_its_tenant_bridge(node):
    lab, dp = node
    tenant, att = tenant_and_attachment()
    port = slot_port_name(att.attachment_id)
    dp.attach(tenant, att)              # the VM is not running yet: networks, router and rules, no port
    assert f"ts-{dp.kernel.tag}" not in probe.run(None, "ip", "netns", "list").stdout, "no veth stand-in for a VM"
    assert dp.reconcile() == [], "a VM that is not running has nothing to repair"
    tap(port)                           # the hypervisor started the VM: its tap, in the hypervisor's namespace
    try:
        assert dp.plug(att.allocation_id)
        assert f"master {bridge_name(next(iter(tenant.networks)).vni)}" in link(port, lab.node_ns[0])
        assert port not in probe.run(None, "ip", "-o", "link").stdout, "moved out of the hypervisor's namespace"
        assert f'"{port}"' in probe.run(None, "ip", "netns", "exec", lab.node_ns[0], "nft", "list", "table",
                                        "bridge", "tessera").stdout, "the anti-spoof rules guard the tap"
        assert dp.reconcile() == []
        # someone unplugs it: the reconcile plugs it back and says so
        probe.run(None, "ip", "-n", lab.node_ns[0], "link", "set", port, "nomaster")
        assert [(r.action, r.kind, r.name) for r in dp.reconcile()] == [("replace", "slot", port)]
        assert "master tbr" in link(port, lab.node_ns[0])
    finally:
        dp.detach(att.allocation_id)
    # detached (the VM was removed first, in production): a tap still held is off the bridge and down, not deleted
    assert "master" not in link(port, lab.node_ns[0]) and "state DOWN" in link(port, lab.node_ns[0])


def test_plugging_a_vm_without_a_tap_or_without_an_attachment_does_nothing(node):
    lab, dp = node
    tenant, att = tenant_and_attachment()
    assert not dp.plug(att.allocation_id)          # no attachment here
    dp.attach(tenant, att)
    try:
        assert not dp.plug(att.allocation_id)      # no tap: the VM is not running
    finally:
        dp.detach(att.allocation_id)
