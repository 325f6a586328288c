"""The Linux leaf's plan (pure): a tenant network's VLAN bridge and VXLAN device, a server port moved between the
provisioning VLAN's bridge and its tenant network's in one step, what is no longer wanted removed last, the leaf's
own links never touched, and what no command can fix refused. The port moves as EVPN and UFM render them."""
from __future__ import annotations

import uuid

import pytest

from services.network.adapters.fabric import EvpnNvueDriver, PortChange, UfmPartitionDriver
from services.network.domain.leaf import LeafRefusal, LeafState, LeafWant, check, plan

NET = uuid.uuid4()
DAY0 = {"ul0": None, "br4094": None, "swp1": "br4094", "prov0": "br4094", "swp2": "br4094"}


def state(masters=None, vxlans=None, bridges=()) -> LeafState:
    return LeafState({**DAY0, **(masters or {})}, vxlans or {}, frozenset(bridges), 1500)


def test_a_bound_port_gets_its_networks_bridge_and_vxlan_then_moves_in_one_step():
    cmds = plan(state(), LeafWant({0x2715: (2, NET)}, {"swp1": 2}), 4094)
    assert cmds == [
        ["ip", "link", "add", "br2", "type", "bridge", "mcast_snooping", "0", "stp_state", "0", "forward_delay", "0"],
        ["ip", "link", "set", "br2", "alias", f"tessera:vlan:{NET}"],
        ["ip", "link", "set", "br2", "up"],
        ["ip", "link", "add", "vx002715", "type", "vxlan", "id", str(0x2715), "group", "239.0.39.21", "dev", "ul0",
         "dstport", "4789", "learning"],
        ["ip", "link", "set", "vx002715", "alias", f"tessera:vxlan:{NET}"],
        ["ip", "link", "set", "vx002715", "mtu", "1450", "master", "br2", "up"],
        ["ip", "link", "set", "swp1", "master", "br2"]]


def test_a_leaf_that_already_matches_needs_nothing():
    done = state({"br2": None, "vx002715": "br2", "swp1": "br2"}, {0x2715: "vx002715"}, {"br2"})
    assert plan(done, LeafWant({0x2715: (2, NET)}, {"swp1": 2}), 4094) == []


def test_an_unbound_port_goes_back_to_provisioning_before_its_networks_devices_go():
    bound = state({"br2": None, "vx002715": "br2", "swp1": "br2"}, {0x2715: "vx002715"}, {"br2"})
    assert plan(bound, LeafWant({}, {}, frozenset({"swp1"})), 4094) == [
        ["ip", "link", "set", "swp1", "master", "br4094"], ["ip", "link", "del", "vx002715"],
        ["ip", "link", "del", "br2"]]


def test_links_the_provider_made_are_never_touched():
    foreign = state({"br7": None, "vxother": "br7", "swp2": "br7"})   # no Tessera alias: not in vxlans or bridges
    assert plan(foreign, LeafWant({}, {}), 4094) == []


@pytest.mark.parametrize("leaf, want, missing", [
    (LeafState({k: v for k, v in DAY0.items() if k != "ul0"}, {}), LeafWant({}, {"swp1": 2}), "has no ul0"),
    (state(), LeafWant({}, {"swp9": 2}), "has no port swp9"),
    (state(), LeafWant({}, {}, frozenset({"swp9"})), "has no port swp9"),
])
def test_what_no_command_can_fix_is_refused(leaf, want, missing):
    with pytest.raises(LeafRefusal, match=missing):
        check(leaf, want, 4094)


CHANGE = PortChange(tenant_id=uuid.uuid4(), network_id=NET, allocation_id=uuid.uuid4(), node_id=uuid.uuid4(),
                    leaf="leaf-07", port="swp12", vlan=5, vni=0x2715, pkey=0x12, hca_guids=("0x0002c903000e0b72",))


def test_evpn_renders_the_access_vlan_of_the_port_and_ufm_the_hca_guids_in_the_partition():
    evpn, ufm = EvpnNvueDriver(provisioning_vlan=4000), UfmPartitionDriver("https://ufm")
    port = lambda vlan: {"interface": {"swp12": {"bridge": {"domain": {"br_default": {"access": vlan}}}}}}  # noqa: E731
    assert [(c.method, c.url, c.body) for c in evpn.bind_calls(CHANGE)] == [
        ("PATCH", "https://leaf-07:8765/nvue_v1/", port(5))]
    assert [c.body for c in evpn.unbind_calls(CHANGE)] == [port(4000)]
    assert [(c.url, c.body) for c in ufm.bind_calls(CHANGE)] == [("https://ufm/ufmRest/resources/pkeys", {
        "pkey": "0x0012", "guids": ["0x0002c903000e0b72"], "membership": "full", "index0": True, "ip_over_ib": True})]
    assert [(c.url, c.body) for c in ufm.unbind_calls(CHANGE)] == [
        ("https://ufm/ufmRest/actions/remove_guids_from_pkey", {"pkey": "0x0012", "guids": ["0x0002c903000e0b72"]})]


def test_no_hca_guids_no_partition_call():
    assert UfmPartitionDriver().bind_calls(PortChange(**{**CHANGE.__dict__, "hca_guids": ()})) == []


def test_the_provisioning_vlan_is_never_leased_to_a_network():
    from services.network.domain.model import NetworkPlan
    pool = NetworkPlan(provisioning_vlan=3).vlans
    assert pool.lowest_free([2]) == 4   # 3 is the provisioning VLAN
