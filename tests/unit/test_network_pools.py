"""Provider pools (VRF ids, PKeys, NAT addresses, VLANs), GUIDs, the node → leaf map and the
settings that configure them (pure, no I/O)."""
from __future__ import annotations

import ipaddress
import uuid

import pytest

from services.network.adapters.fabric import EvpnNvueDriver, UfmPartitionDriver
from services.network.bootstrap import fabric_from_env
from services.network.domain.model import LeafMap, PKeyPool, VlanPool, VrfPool, guid_for, nat_pool
from services.network.settings import plan_from_env


def test_pkey_pool_defaults_to_0x0001_through_0x7ffe_and_refuses_the_default_partition():
    assert (PKeyPool().first, PKeyPool().last) == (0x0001, 0x7FFE)
    with pytest.raises(ValueError, match="PKey pool"):
        PKeyPool(1, 0x7FFF)


def test_vrf_pool_refuses_the_kernels_reserved_tables():
    with pytest.raises(ValueError, match="VRF table pool"):
        VrfPool(253, 300)


def test_every_pool_hands_out_the_lowest_free_value_and_none_when_exhausted():
    assert PKeyPool(5, 7).lowest_free([5, 7]) == 6
    assert VrfPool(1000, 1001).lowest_free([1000, 1001]) is None
    assert VlanPool().lowest_free([]) == 2


def test_nat_pool_holds_the_host_addresses_of_the_provider_cidr():
    pool = nat_pool(ipaddress.IPv4Network("203.0.113.0/29"))
    assert (ipaddress.IPv4Address(pool.first), ipaddress.IPv4Address(pool.last)) == (
        ipaddress.IPv4Address("203.0.113.1"), ipaddress.IPv4Address("203.0.113.6"))
    assert pool.size == 6
    assert ipaddress.IPv4Address(pool.lowest_free([pool.first])) == ipaddress.IPv4Address("203.0.113.2")


def test_guid_is_deterministic_64_bit_hex_and_locally_assigned():
    a, b = uuid.uuid4(), uuid.uuid4()
    assert guid_for(a) == guid_for(a) != guid_for(b)
    assert len(guid_for(a)) == 16 and guid_for(a).startswith("02") and int(guid_for(a), 16) > 0


def test_leaf_map_prefers_the_explicit_entry_and_otherwise_is_deterministic_within_the_count():
    node, other = uuid.uuid4(), uuid.uuid4()
    leaves = LeafMap({node: "leaf-a7"}, count=3)
    assert leaves.leaf_of(node) == "leaf-a7"
    assert leaves.leaf_of(other) == leaves.leaf_of(other) in {"leaf-01", "leaf-02", "leaf-03"}
    spread = {LeafMap(count=3).leaf_of(uuid.uuid4()) for _ in range(200)}
    assert spread == {"leaf-01", "leaf-02", "leaf-03"}


def test_plan_from_env_reads_every_pool_and_the_leaf_map():
    node = uuid.uuid4()
    plan = plan_from_env({"TESSERA_NETWORK_VNI_MIN": "20000", "TESSERA_NETWORK_VNI_MAX": "20100",
                          "TESSERA_NETWORK_VRF_MIN": "2000", "TESSERA_NETWORK_VRF_MAX": "2100",
                          "TESSERA_NETWORK_PKEY_MIN": "0x0100", "TESSERA_NETWORK_PKEY_MAX": "0x01ff",
                          "TESSERA_NETWORK_NAT_CIDR": "203.0.113.0/24", "TESSERA_NETWORK_TENANT_CIDR": "10.5.0.0/16",
                          "TESSERA_NETWORK_DEFAULT_POOL": "10.0.0.0/12",
                          "TESSERA_NETWORK_LEAF_MAP": f"{node}=leaf-x", "TESSERA_NETWORK_LEAF_COUNT": "2"})
    assert (plan.vnis.first, plan.vnis.last, plan.vrfs.first, plan.vrfs.last) == (20000, 20100, 2000, 2100)
    assert (plan.pkeys.first, plan.pkeys.last) == (0x100, 0x1FF)
    assert str(plan.nat_cidr) == "203.0.113.0/24" and str(plan.tenant_cidr) == "10.5.0.0/16"
    assert str(plan.default_pool) == "10.0.0.0/12" and str(plan_from_env({}).default_pool) == "10.0.0.0/8"
    assert plan.leaves.leaf_of(node) == "leaf-x" and plan.leaves.count == 2


@pytest.mark.parametrize(("name", "value"), [
    ("TESSERA_NETWORK_VRF_MIN", "x"), ("TESSERA_NETWORK_PKEY_MAX", "0x8000"), ("TESSERA_NETWORK_VNI_MAX", "99999999"),
    ("TESSERA_NETWORK_NAT_CIDR", "203.0.113.0/31"), ("TESSERA_NETWORK_NAT_CIDR", "not-a-cidr"),
    ("TESSERA_NETWORK_TENANT_CIDR", "10.0.0.1/24"), ("TESSERA_NETWORK_LEAF_MAP", "leaf-1"),
    ("TESSERA_NETWORK_LEAF_COUNT", "0"), ("TESSERA_NETWORK_DEFAULT_POOL", "10.0.0.0/25"),
    ("TESSERA_NETWORK_DEFAULT_POOL", "not-a-cidr"), ("TESSERA_NETWORK_LEAF_NETNS", "leaf-1"),
    ("TESSERA_NETWORK_LEAF_NETNS", "leaf-1=ns/../x"), ("TESSERA_NETWORK_PROVISIONING_VLAN", "4095"),
    ("TESSERA_NETWORK_PROVISIONING_VLAN", "1"),
])
def test_a_bad_setting_is_refused_naming_its_variable(name, value):
    with pytest.raises(ValueError, match=name):
        plan_from_env({name: value})


def test_fabric_defaults_to_both_recording_drivers_and_refuses_an_unknown_name():
    drivers = fabric_from_env({})
    assert [type(d) for d in drivers] == [EvpnNvueDriver, UfmPartitionDriver]
    assert fabric_from_env({"TESSERA_NETWORK_FABRIC": "none"}) == []
    assert [d.name for d in fabric_from_env({"TESSERA_NETWORK_FABRIC": "infiniband"})] == ["infiniband"]
    with pytest.raises(ValueError, match="TESSERA_NETWORK_FABRIC"):
        fabric_from_env({"TESSERA_NETWORK_FABRIC": "evpn,junos"})


def test_the_linux_leaf_driver_gets_its_leaves_and_the_provisioning_vlan_which_no_network_leases():
    [evpn, leaf] = fabric_from_env({"TESSERA_NETWORK_FABRIC": "evpn,leaf", "TESSERA_NETWORK_PROVISIONING_VLAN": "100",
                                    "TESSERA_NETWORK_LEAF_NETNS": "leaf-a=ns-a, leaf-b=ns-b"})
    assert leaf.netns == {"leaf-a": "ns-a", "leaf-b": "ns-b"} and leaf.provisioning_vlan == 100
    assert evpn.provisioning_vlan == 100
    plan = plan_from_env({"TESSERA_NETWORK_PROVISIONING_VLAN": "100"})
    assert plan.provisioning_vlan == 100 and plan.vlans.lowest_free(range(2, 100)) == 101
