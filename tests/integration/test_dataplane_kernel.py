"""The node dataplane with REAL packets: three "nodes" (network namespaces joined by an underlay bridge),
each driven by its own KernelDataplane, carry tenant traffic over VXLAN and enforce isolation."""
from __future__ import annotations

import random
import uuid

import pytest

from services.network.contracts import NetworkSnapshot, SecurityRule, SlotAttachment, TenantNetworks
from services.node_agent.adapters.dataplane import KernelError, probe
from services.node_agent.adapters.dataplane.lab import Lab, is_root
from services.node_agent.domain.dataplane.names import bridge_name, slot_port_name, vxlan_name
from tests.support.polling import eventually_blocking

pytestmark = pytest.mark.skipif(not is_root(), reason="kernel dataplane tests need root (namespaces, veth, nftables)")


@pytest.fixture(scope="module")
def lab():
    lab = Lab(3).build()
    yield lab
    lab.destroy()
    assert not [ns for ns in probe.run(None, "ip", "netns", "list").stdout.split() if lab.suffix in ns]


@pytest.fixture
def plumbed(lab):
    """Detaches, after the test, every attachment the test made (through the dataplane, as production would)."""
    made: list[tuple[int, uuid.UUID]] = []
    yield made
    for node, alloc in made:
        lab.dataplanes[node].detach(alloc)


def network(cidr: str, rules=()) -> NetworkSnapshot:
    prefix = cidr.rsplit(".", 1)[0]
    return NetworkSnapshot(network_id=uuid.uuid4(), name=cidr, vni=random.randint(1, 16_000_000), cidr=cidr,
                           gateway_ip=f"{prefix}.1", vrf_table=1, rules=list(rules))


def attach(lab, plumbed, node: int, tenant: TenantNetworks, net: NetworkSnapshot, ip: str) -> SlotAttachment:
    att = SlotAttachment(attachment_id=uuid.uuid4(), allocation_id=uuid.uuid4(), network_id=net.network_id,
                         ip_address=ip, prefix_len=24, mac_address="02:" + ":".join(f"{b:02x}" for b in random.randbytes(5)))
    lab.dataplanes[node].attach(tenant, att)
    plumbed.append((node, att.allocation_id))
    return att


def ns_of(lab, node: int, att: SlotAttachment) -> str:
    return lab.dataplanes[node].desired().slots[att.allocation_id].netns


def test_slots_of_one_tenant_network_on_different_nodes_ping_and_talk_tcp_over_vxlan(lab, plumbed):
    net = network("10.10.0.0/24")
    tenant = TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[net])
    a = attach(lab, plumbed, 0, tenant, net, "10.10.0.10")
    b = attach(lab, plumbed, 1, tenant, net, "10.10.0.11")
    c = attach(lab, plumbed, 2, tenant, net, "10.10.0.12")
    assert probe.reaches(ns_of(lab, 0, a), "10.10.0.11") and probe.reaches(ns_of(lab, 2, c), "10.10.0.10")
    server = probe.start(ns_of(lab, 1, b), probe.TCP_SERVER, "10.10.0.11", "7000")
    try:
        assert probe.tcp_eventually(ns_of(lab, 0, a), "10.10.0.11", 7000)
        assert probe.tcp_eventually(ns_of(lab, 2, c), "10.10.0.11", 7000)
    finally:
        server.kill()


def test_kernel_interfaces_addresses_and_macs_match_the_attachment(lab, plumbed):
    net = network("10.11.0.0/24")
    tenant = TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[net])
    att = attach(lab, plumbed, 0, tenant, net, "10.11.0.20")
    ns = ns_of(lab, 0, att)
    link = probe.run(ns, "ip", "-o", "link", "show", "eth0").stdout
    addrs = probe.run(ns, "ip", "-o", "-4", "addr", "show", "dev", "eth0").stdout
    route = probe.run(ns, "ip", "route", "show", "default").stdout
    assert f"link/ether {att.mac_address}" in link
    assert "inet 10.11.0.20/24" in addrs and addrs.count("inet ") == 1
    assert route.startswith("default via 10.11.0.1 dev eth0")
    node_links = probe.run(lab.node_ns[0], "ip", "-o", "-d", "link", "show").stdout
    port_line = next(ln for ln in node_links.splitlines() if f" {slot_port_name(att.attachment_id)}@" in ln)
    assert f"master {bridge_name(net.vni)}" in port_line and f"alias tessera:slot:{att.attachment_id}" in port_line
    vx_line = next(ln for ln in node_links.splitlines() if f" {vxlan_name(net.vni)}:" in ln)
    assert f"vxlan id {net.vni} group 239." in vx_line and "dev ul0" in vx_line and "nolearning" not in vx_line


def test_tenant_b_with_the_same_cidr_cannot_reach_tenant_a_and_a_cannot_reach_b(lab, plumbed):
    net_a, net_b = network("10.20.0.0/24"), network("10.20.0.0/24")
    tenant_a = TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[net_a])
    tenant_b = TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[net_b])
    a0, a1 = attach(lab, plumbed, 0, tenant_a, net_a, "10.20.0.10"), attach(lab, plumbed, 1, tenant_a, net_a, "10.20.0.11")
    b0, b1 = attach(lab, plumbed, 0, tenant_b, net_b, "10.20.0.30"), attach(lab, plumbed, 1, tenant_b, net_b, "10.20.0.31")
    # each tenant's own path works, so the denials below are isolation, not a broken overlay
    assert probe.reaches(ns_of(lab, 0, a0), "10.20.0.11") and probe.reaches(ns_of(lab, 0, b0), "10.20.0.31")
    for guess in ("10.20.0.10", "10.20.0.11"):       # B guesses A's addresses, same node and across nodes
        assert probe.never_reaches(ns_of(lab, 0, b0), guess) and probe.never_reaches(ns_of(lab, 1, b1), guess)
    for guess in ("10.20.0.30", "10.20.0.31"):
        assert probe.never_reaches(ns_of(lab, 0, a0), guess) and probe.never_reaches(ns_of(lab, 1, a1), guess)
    server = probe.start(ns_of(lab, 1, a1), probe.TCP_SERVER, "0.0.0.0", "7001")
    try:
        assert not probe.tcp_connects(ns_of(lab, 0, b0), "10.20.0.11", 7001)
    finally:
        server.kill()


def test_two_networks_of_a_tenant_are_isolated_until_a_rule_opens_only_its_port(lab, plumbed):
    web, db = network("10.30.1.0/24"), network("10.30.2.0/24")
    tenant = TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[web, db])
    w = attach(lab, plumbed, 0, tenant, web, "10.30.1.10")
    d = attach(lab, plumbed, 1, tenant, db, "10.30.2.10")
    w_ns, d_ns = ns_of(lab, 0, w), ns_of(lab, 1, d)
    servers = [probe.start(d_ns, probe.TCP_SERVER, "0.0.0.0", port) for port in ("5432", "6000")]
    servers.append(probe.start(w_ns, probe.TCP_SERVER, "0.0.0.0", "5432"))
    try:
        assert probe.reaches(w_ns, "10.30.1.1")                          # its gateway answers
        assert not probe.tcp_connects(w_ns, "10.30.2.10", 5432) and probe.never_reaches(w_ns, "10.30.2.10")
        rule = SecurityRule(id=uuid.uuid4(), direction="ingress", protocol="tcp", port_from=5432, port_to=5432,
                            remote_network_id=web.network_id)
        v2 = TenantNetworks(tenant_id=tenant.tenant_id, version=2,
                            networks=[web, db.model_copy(update={"rules": [rule]})])
        assert lab.dataplanes[0].update_tenant(v2) and lab.dataplanes[1].update_tenant(v2)
        assert not lab.dataplanes[0].update_tenant(tenant)                # an older snapshot is ignored
        assert probe.tcp_eventually(w_ns, "10.30.2.10", 5432)              # web -> db:5432 opened, across nodes
        assert not probe.tcp_connects(w_ns, "10.30.2.10", 6000)            # another port stays closed
        assert not probe.tcp_connects(d_ns, "10.30.1.10", 5432)            # the reverse direction stays closed
        assert probe.never_reaches(w_ns, "10.30.2.10")                     # and so does ICMP
    finally:
        for server in servers:
            server.kill()


def test_a_slot_forging_its_source_ip_mac_or_arp_gets_nothing_through(lab, plumbed):
    net = network("10.40.0.0/24")
    tenant = TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[net])
    bad = attach(lab, plumbed, 0, tenant, net, "10.40.0.10")
    good = attach(lab, plumbed, 1, tenant, net, "10.40.0.11")
    bad_ns, good_ns = ns_of(lab, 0, bad), ns_of(lab, 1, good)
    assert probe.reaches(bad_ns, "10.40.0.11")
    probe.run(bad_ns, "ip", "neigh", "replace", "10.40.0.11", "lladdr", good.mac_address, "dev", "eth0", "nud", "permanent")
    probe.run(bad_ns, "ip", "addr", "add", "10.40.0.99/32", "dev", "eth0")
    sink = probe.start(good_ns, probe.UDP_SINK, "0.0.0.0", "9999")
    try:
        probe.udp_send(bad_ns, "10.40.0.10", "10.40.0.11", 9999, "legit-1")
        probe.udp_send(bad_ns, "10.40.0.99", "10.40.0.11", 9999, "forged-ip")
        probe.run(bad_ns, "ip", "link", "set", "eth0", "address", "02:66:66:66:66:66")
        probe.udp_send(bad_ns, "10.40.0.10", "10.40.0.11", 9999, "forged-mac")
        probe.run(bad_ns, "ip", "link", "set", "eth0", "address", bad.mac_address)
        probe.udp_send(bad_ns, "10.40.0.10", "10.40.0.11", 9999, "legit-2")
        received = probe.read_lines(sink, 2)                            # in order: legit-2 was sent last
        assert received == ["legit-1", "legit-2"]                        # the forged ones, sent between, never arrived
    finally:
        sink.kill()
    probe.run(good_ns, "ip", "neigh", "flush", "all")
    probe.arp_request(bad_ns, "eth0", bad.mac_address, "10.40.0.77", "10.40.0.11")   # forged sender IP
    probe.arp_request(bad_ns, "eth0", bad.mac_address, "10.40.0.10", "10.40.0.11")   # its own
    eventually_blocking(lambda: probe.neighbour(good_ns, "10.40.0.10") != "", timeout=10,
                        what="the slot's own ARP to teach its neighbour 10.40.0.10")
    assert probe.neighbour(good_ns, "10.40.0.77") == ""


def test_detach_removes_exactly_what_attach_made_and_the_last_slot_takes_the_network_along(lab):
    dp, node_ns = lab.dataplanes[2], lab.node_ns[2]
    assert dp.observe() == {}
    net = network("10.50.0.0/24")
    tenant = TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[net])
    first = attach(lab, [], 2, tenant, net, "10.50.0.10")
    second = attach(lab, [], 2, tenant, net, "10.50.0.11")
    assert set(dp.observe()) == set(dp.desired().objects())
    assert dp.detach(first.allocation_id) and not dp.detach(first.allocation_id)   # idempotent
    left = dp.observe()
    assert ("bridge", bridge_name(net.vni)) in left and ("slot", ns_of(lab, 2, second)) in left
    assert not [k for k in left if k[0] == "slot" and first.attachment_id.hex[:12] in k[1]]
    assert dp.detach(second.allocation_id)
    assert dp.observe() == {}
    links = probe.run(node_ns, "ip", "-o", "link", "show").stdout
    assert not [name for name in ("tbr", "tvx", "tlg", "tv") if f": {name}" in links]
    assert "tessera" not in probe.run(node_ns, "nft", "list", "ruleset").stdout
    spaces = probe.run(None, "ip", "netns", "list").stdout
    assert dp.kernel.tag not in spaces


def test_attach_that_fails_midway_leaves_nothing_and_keeps_the_foreign_link(lab):
    dp, node_ns = lab.dataplanes[2], lab.node_ns[2]
    net = network("10.60.0.0/24")
    tenant = TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[net])
    att = SlotAttachment(attachment_id=uuid.uuid4(), allocation_id=uuid.uuid4(), network_id=net.network_id,
                         ip_address="10.60.0.10", prefix_len=24, mac_address="02:00:00:00:60:10")
    taken = slot_port_name(att.attachment_id)
    probe.run(node_ns, "ip", "link", "add", taken, "type", "bridge")       # someone else's link under the port's name
    try:
        with pytest.raises(KernelError, match="not owned by tessera"):
            dp.attach(tenant, att)
        assert dp.observe() == {} and att.allocation_id not in dp.attachments
        assert f": {taken}:" in probe.run(node_ns, "ip", "-o", "link", "show", taken).stdout
    finally:
        probe.run(node_ns, "ip", "link", "del", taken)


def test_reconcile_restores_deleted_interfaces_removes_a_stray_one_and_reports_each_repair(lab, plumbed):
    dp, node_ns = lab.dataplanes[0], lab.node_ns[0]
    net = network("10.70.0.0/24")
    tenant = TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[net])
    a = attach(lab, plumbed, 0, tenant, net, "10.70.0.10")
    attach(lab, plumbed, 1, tenant, net, "10.70.0.11")
    assert dp.reconcile() == []                                          # nothing to do when intact
    probe.run(node_ns, "ip", "link", "del", vxlan_name(net.vni))
    probe.run(node_ns, "ip", "link", "del", slot_port_name(a.attachment_id))
    stray = f"tbr{random.randint(0, 0xFFFFFF):06x}"
    probe.run(node_ns, "ip", "link", "add", stray, "type", "bridge")
    probe.run(node_ns, "ip", "link", "set", stray, "alias", "tessera:bridge:stray")
    repairs = {(r.action, r.kind, r.name) for r in dp.reconcile()}
    assert repairs == {("create", "vxlan", vxlan_name(net.vni)), ("replace", "slot", ns_of(lab, 0, a)),
                       ("remove", "bridge", stray)}
    want = {k: o.fp for k, o in dp.desired().objects().items()}
    assert dp.observe() == want and dp.reconcile() == []
    assert probe.reaches(ns_of(lab, 0, a), "10.70.0.11")
