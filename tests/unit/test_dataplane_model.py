"""The dataplane's pure parts: desired kernel objects, their names, the nft rules, and the repair plan."""
from __future__ import annotations

import uuid

import pytest

from services.network.contracts import NetworkSnapshot, SecurityRule, SlotAttachment, TenantNetworks
from services.node_agent.domain.dataplane import model, names, render
from services.node_agent.domain.dataplane.model import InvalidAttachment, desired_state
from services.node_agent.domain.dataplane.reconcile import plan

TAG = "0a1b2c3d"


def net(cidr: str, vni: int, rules=()) -> NetworkSnapshot:
    return NetworkSnapshot(network_id=uuid.uuid4(), name=cidr, vni=vni, cidr=cidr,
                           gateway_ip=cidr.rsplit(".", 1)[0] + ".1", vrf_table=3, rules=list(rules))


def att(network: NetworkSnapshot, ip: str, prefix: int = 24) -> SlotAttachment:
    return SlotAttachment(attachment_id=uuid.uuid4(), allocation_id=uuid.uuid4(), network_id=network.network_id,
                          ip_address=ip, prefix_len=prefix, mac_address="02:AA:BB:CC:DD:01")


def tenant(*networks: NetworkSnapshot, version: int = 1) -> TenantNetworks:
    return TenantNetworks(tenant_id=uuid.uuid4(), version=version, networks=list(networks))


def test_every_owned_name_fits_the_kernel_limit_and_carries_its_prefix():
    biggest, some = 16_777_215, uuid.uuid4()
    links = [names.bridge_name(biggest), names.vxlan_name(biggest), names.leg_name(biggest), names.gw_ifname(biggest),
             names.slot_port_name(some)]
    assert all(len(n) <= 15 for n in links)
    assert [n[:3] for n in links[:3]] == ["tbr", "tvx", "tlg"] and links[4].startswith("tv")
    assert names.slot_netns(TAG, some).startswith(f"ts-{TAG}-") and names.router_netns(TAG, some).startswith(f"tr-{TAG}-")
    assert names.port_of_slot_netns(names.slot_netns(TAG, some)) == names.slot_port_name(some)


def test_vxlan_group_is_derived_from_the_vni_and_the_gateway_mac_differs_per_node():
    assert names.vxlan_group(0x0102FF) == "239.1.2.255"
    assert names.gateway_mac("node0001", 7) != names.gateway_mac("node0002", 7)
    assert names.gateway_mac("node0001", 7) == names.gateway_mac("node0001", 7)
    assert int(names.gateway_mac("x", 1).split(":")[0], 16) & 0b10   # locally administered


def test_a_tenant_with_a_slot_here_gets_its_router_and_every_one_of_its_networks():
    web, db = net("10.0.1.0/24", 101), net("10.0.2.0/24", 102)
    a = tenant(web, db)
    slot = att(web, "10.0.1.10")
    state = desired_state(TAG, {a.tenant_id: a}, [(a.tenant_id, slot)])
    assert set(state.segments) == {101, 102}
    assert state.routers == {a.tenant_id: names.router_netns(TAG, a.tenant_id)}
    port = state.slots[slot.allocation_id]
    assert (port.ip_address, port.prefix_len, port.mac_address, port.gateway_ip, port.vni) == \
        ("10.0.1.10", 24, "02:aa:bb:cc:dd:01", "10.0.1.1", 101)
    kinds = sorted(k for k, _ in state.objects())
    assert kinds == ["bridge", "bridge", "leg", "leg", "nft_node", "nft_router", "router", "slot", "vxlan", "vxlan"]


def test_a_tenant_without_slots_here_has_nothing_on_the_node():
    a, b = tenant(net("10.0.1.0/24", 101)), tenant(net("10.0.1.0/24", 201))
    state = desired_state(TAG, {a.tenant_id: a, b.tenant_id: b}, [(a.tenant_id, att(a.networks[0], "10.0.1.5"))])
    assert set(state.segments) == {101} and set(state.routers) == {a.tenant_id}


@pytest.mark.parametrize("ip, prefix, message", [("10.0.9.5", 24, "is not in"), ("10.0.1.5", 16, "is not in"),
                                                  ("10.0.1.1", 24, "gateway"), ("10.0.1.300", 24, "not an IP")])
def test_an_attachment_that_does_not_fit_its_network_is_refused(ip, prefix, message):
    a = tenant(net("10.0.1.0/24", 101))
    bad = att(a.networks[0], "10.0.1.5").model_copy(update={"ip_address": ip, "prefix_len": prefix})
    with pytest.raises(InvalidAttachment, match=message):
        desired_state(TAG, {a.tenant_id: a}, [(a.tenant_id, bad)])


def test_an_attachment_to_a_network_of_another_tenant_is_refused():
    a, b = tenant(net("10.0.1.0/24", 101)), tenant(net("10.0.1.0/24", 201))
    with pytest.raises(InvalidAttachment, match="is not one of tenant"):
        desired_state(TAG, {a.tenant_id: a, b.tenant_id: b}, [(a.tenant_id, att(b.networks[0], "10.0.1.5"))])


def test_router_forwards_nothing_between_networks_without_rules():
    text = render.router_table(tenant(net("10.0.1.0/24", 1), net("10.0.2.0/24", 2)))
    assert "policy drop;" in text and "accept" not in text


def test_an_ingress_rule_opens_its_port_from_the_remote_and_only_replies_back():
    web, db = net("10.0.1.0/24", 1), net("10.0.2.0/24", 2)
    rule = SecurityRule(id=uuid.uuid4(), direction="ingress", protocol="tcp", port_from=5432, port_to=5433,
                        remote_network_id=web.network_id)
    text = render.router_table(tenant(web, db.model_copy(update={"rules": [rule]})))
    assert 'iifname "gw000001" oifname "gw000002" tcp dport 5432-5433 accept' in text
    assert 'iifname "gw000002" oifname "gw000001" tcp sport 5432-5433 tcp flags & (syn | ack) != syn accept' in text
    assert text.count(" accept ") == 2


def test_an_egress_rule_opens_from_its_network_towards_the_remote():
    web, db = net("10.0.1.0/24", 1), net("10.0.2.0/24", 2)
    rule = SecurityRule(id=uuid.uuid4(), direction="egress", protocol="udp", port_from=53, remote_network_id=db.network_id)
    [(src, dst, _)] = render.opened_flows(tenant(web.model_copy(update={"rules": [rule]}), db))
    assert (src, dst) == (1, 2)


def test_a_rule_naming_a_network_outside_the_tenant_opens_nothing():
    foreign = uuid.uuid4()
    rule = SecurityRule(id=uuid.uuid4(), direction="ingress", protocol="any", remote_network_id=foreign)
    cidr_rule = SecurityRule(id=uuid.uuid4(), direction="egress", protocol="tcp", remote_cidr="0.0.0.0/0")
    a = tenant(net("10.0.1.0/24", 1, rules=[rule, cidr_rule]), net("10.0.2.0/24", 2))
    assert render.opened_flows(a) == [] and "accept" not in render.router_table(a)


def test_node_table_lets_each_slot_port_send_only_its_own_mac_and_ip():
    a = tenant(net("10.0.1.0/24", 1))
    slot = att(a.networks[0], "10.0.1.10")
    state = desired_state(TAG, {a.tenant_id: a}, [(a.tenant_id, slot)])
    port = names.slot_port_name(slot.attachment_id)
    assert f'iifname vmap {{ "{port}" : jump slot_{port} }}' in state.node_nft
    assert "ether saddr != 02:aa:bb:cc:dd:01 drop" in state.node_nft
    assert "arp saddr ether 02:aa:bb:cc:dd:01 arp saddr ip 10.0.1.10 accept" in state.node_nft
    assert "ip saddr 10.0.1.10 accept" in state.node_nft and state.node_nft.rstrip().endswith("drop\n\t}")


def test_table_script_replaces_the_table_atomically_and_deletes_idempotently():
    script = render.table_script("bridge", "\tchain x {\n\t}\n", "abc")
    assert script.splitlines()[:2] == ["table bridge tessera", "delete table bridge tessera"]
    assert 'comment "tessera:abc"' in script
    assert render.table_script("inet", None) == "table inet tessera\ndelete table inet tessera\n"


def _state():
    a = tenant(net("10.0.1.0/24", 1))
    return desired_state(TAG, {a.tenant_id: a}, [(a.tenant_id, att(a.networks[0], "10.0.1.10"))])


def test_plan_is_empty_when_the_kernel_matches():
    state = _state()
    assert plan({k: o.fp for k, o in state.objects().items()}, state) == []


def test_plan_creates_in_dependency_order_from_nothing():
    assert [r.kind for r in plan({}, _state())] == list(model.KIND_ORDER)
    assert {r.action for r in plan({}, _state())} == {"create"}


def test_plan_removes_strays_first_replaces_drift_and_lets_a_router_take_its_table_along():
    state = _state()
    current = {k: o.fp for k, o in state.objects().items()}
    vx = next(k for k in current if k[0] == "vxlan")
    current[vx] = "vni=9 group=239.0.0.9 master=tbr000001"
    current[("slot", f"ts-{TAG}-ffffffffffff")] = "master=None mac= ip=None"
    current[("router", f"tr-{TAG}-eeeeeeeeeeee")] = ""
    current[("nft_router", f"tr-{TAG}-eeeeeeeeeeee")] = "x"
    repairs = plan(current, state)
    assert [(r.action, r.kind) for r in repairs] == [("remove", "slot"), ("remove", "router"), ("replace", "vxlan")]
