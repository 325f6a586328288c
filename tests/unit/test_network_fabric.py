"""The exact calls the fabric drivers render for attach and detach (pure, no I/O)."""
from __future__ import annotations

import dataclasses
import ipaddress
import uuid

from services.network.adapters.fabric import EvpnNvueDriver, FabricCall, FabricChange, UfmPartitionDriver

TENANT, NETWORK, ALLOC, NODE = (uuid.UUID(int=i) for i in (1, 2, 3, 4))
CHANGE = FabricChange(
    tenant_id=TENANT, network_id=NETWORK, vni=10_001, cidr=ipaddress.IPv4Network("10.0.0.0/24"),
    gateway_ip=ipaddress.IPv4Address("10.0.0.1"), vrf_table=1000, l3_vni=10_000, pkey=0x0a12, allocation_id=ALLOC,
    guid="02aabbccddeeff00", node_id=NODE, leaf="leaf-02", vlan=2, network_alone_on_leaf=True,
    tenant_alone_on_leaf=True, tenant_alone=True)
NVUE = "https://leaf-02:8765/nvue_v1/"
UFM = "https://ufm.fabric.local/ufmRest"


def alone(**flags) -> FabricChange:
    return dataclasses.replace(CHANGE, **{"network_alone_on_leaf": False, "tenant_alone_on_leaf": False,
                                          "tenant_alone": False, **flags})


def test_first_attachment_of_a_tenant_on_a_leaf_renders_its_vrf_l3_vni_l2_vni_vlan_and_gateway_svi():
    assert EvpnNvueDriver().attach_calls(CHANGE) == [FabricCall("PATCH", NVUE, {
        "vrf": {"vrf-1000": {"table": 1000, "evpn": {"enable": "on", "vni": {"10000": {}}},
                             "router": {"bgp": {"enable": "on"}}}},
        "bridge": {"domain": {"br_default": {"vlan": {"2": {"vni": {"10001": {}}}}}}},
        "interface": {"vlan2": {"type": "svi", "vlan": 2, "ip": {"vrf": "vrf-1000", "address": {"10.0.0.1/24": {}}}}},
    })]


def test_a_second_network_of_the_tenant_on_the_leaf_adds_only_its_l2_vni_and_svi():
    [call] = EvpnNvueDriver().attach_calls(alone(network_alone_on_leaf=True))
    assert set(call.body) == {"bridge", "interface"}


def test_another_slot_of_a_network_already_on_the_leaf_changes_nothing_on_the_switch():
    assert EvpnNvueDriver().attach_calls(alone()) == []
    assert EvpnNvueDriver().detach_calls(alone()) == []


def test_the_last_slot_of_a_network_leaving_a_leaf_removes_its_vlan_and_svi_and_the_tenants_last_the_vrf():
    assert EvpnNvueDriver().detach_calls(alone(network_alone_on_leaf=True)) == [FabricCall("PATCH", NVUE, {
        "bridge": {"domain": {"br_default": {"vlan": {"2": None}}}}, "interface": {"vlan2": None}})]
    assert EvpnNvueDriver().detach_calls(CHANGE) == [FabricCall("PATCH", NVUE, {
        "bridge": {"domain": {"br_default": {"vlan": {"2": None}}}}, "interface": {"vlan2": None},
        "vrf": {"vrf-1000": None}})]


def test_the_tenants_first_attachment_creates_its_partition_and_adds_the_vf_guid_as_full_member():
    assert UfmPartitionDriver().attach_calls(CHANGE) == [
        FabricCall("POST", f"{UFM}/resources/pkeys/add", {"pkey": "0x0a12", "index0": True, "ip_over_ib": True,
                                                          "mtu_limit": 4, "service_level": 0, "rate_limit": 300}),
        FabricCall("POST", f"{UFM}/resources/pkeys", {"pkey": "0x0a12", "guids": ["02aabbccddeeff00"],
                                                      "membership": "full", "index0": True, "ip_over_ib": True}),
    ]
    assert [c.url for c in UfmPartitionDriver("https://ufm.example/").attach_calls(alone())] == [
        "https://ufm.example/ufmRest/resources/pkeys"]


def test_detach_removes_the_guid_and_the_tenants_last_detach_deletes_the_partition():
    remove = FabricCall("POST", f"{UFM}/actions/remove_guids_from_pkey", {"pkey": "0x0a12", "guids": ["02aabbccddeeff00"]})
    assert UfmPartitionDriver().detach_calls(alone()) == [remove]
    assert UfmPartitionDriver().detach_calls(CHANGE) == [remove, FabricCall("DELETE", f"{UFM}/resources/pkeys/0x0a12", None)]
