"""Fabric drivers inside the attach/detach transactions (real NATS and PostgreSQL): the exact
EVPN (NVUE) and InfiniBand (UFM) calls recorded for each attach and detach, and the leaf VLAN
released with the network's last slot on the leaf."""
from __future__ import annotations

import json
import uuid
from functools import partial

from services.network.bootstrap import build, fabric_from_env
from services.network.domain.model import LeafMap, NetworkPlan
from tests.support.network import Net

NODE_1, NODE_2 = uuid.uuid4(), uuid.uuid4()
LEAF = f"leaf-{uuid.uuid4().hex[:8]}"   # a leaf of this test alone: its VLAN pool starts empty
PLAN = NetworkPlan(leaves=LeafMap({NODE_1: LEAF, NODE_2: LEAF}))
UFM = "https://ufm.fabric.local/ufmRest"


async def calls(net: Net, alloc: uuid.UUID) -> list[tuple]:
    rows = await net.fetch("SELECT driver, action, method, url, body FROM fabric_calls WHERE allocation_id=$1 ORDER BY seq",
                           alloc)
    return [(r["driver"], r["action"], r["method"], r["url"], json.loads(r["body"]) if r["body"] else None) for r in rows]


async def test_attach_and_detach_record_the_exact_evpn_and_partition_calls_in_their_transactions(run_service, nc, watch):
    rt = await run_service("network", partial(build, plan=PLAN, fabric=fabric_from_env({})))
    net = Net(rt, nc.jetstream(), await watch("network.evt.>"))
    tenant, first, second = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    created = await net.create(tenant, "train", "10.80.0.0/24")
    network = created["data"]["network"]
    nid = uuid.UUID(network["network_id"])
    [res] = await net.fetch("SELECT vrf_table, pkey, l3_vni FROM tenants WHERE tenant_id=$1", tenant)
    vrf, pkey = f"vrf-{res['vrf_table']}", f"0x{res['pkey']:04x}"
    a1 = await net.attach(tenant, nid, first, NODE_1)
    [g1] = [r["guid"] for r in await net.fetch("SELECT guid FROM attachments WHERE allocation_id=$1", first)]
    nvue = f"https://{LEAF}:8765/nvue_v1/"
    assert a1["type"] == "network.network_attached"
    assert await calls(net, first) == [
        ("evpn", "attach", "PATCH", nvue, {
            "vrf": {vrf: {"table": res["vrf_table"], "evpn": {"enable": "on", "vni": {str(res["l3_vni"]): {}}},
                          "router": {"bgp": {"enable": "on"}}}},
            "bridge": {"domain": {"br_default": {"vlan": {"2": {"vni": {str(network["vni"]): {}}}}}}},
            "interface": {"vlan2": {"type": "svi", "vlan": 2, "ip": {"vrf": vrf, "address": {"10.80.0.1/24": {}}}}}}),
        ("infiniband", "attach", "POST", f"{UFM}/resources/pkeys/add",
         {"pkey": pkey, "index0": True, "ip_over_ib": True, "mtu_limit": 4, "service_level": 0, "rate_limit": 300}),
        ("infiniband", "attach", "POST", f"{UFM}/resources/pkeys",
         {"pkey": pkey, "guids": [g1], "membership": "full", "index0": True, "ip_over_ib": True}),
    ]
    await net.attach(tenant, nid, second, NODE_2)   # same leaf, same network: only the partition membership
    [g2] = [r["guid"] for r in await net.fetch("SELECT guid FROM attachments WHERE allocation_id=$1", second)]
    assert g2 != g1 and await calls(net, second) == [
        ("infiniband", "attach", "POST", f"{UFM}/resources/pkeys",
         {"pkey": pkey, "guids": [g2], "membership": "full", "index0": True, "ip_over_ib": True})]
    await net.detach(tenant, first)
    assert (await calls(net, first))[3:] == [
        ("infiniband", "detach", "POST", f"{UFM}/actions/remove_guids_from_pkey", {"pkey": pkey, "guids": [g1]})]
    assert await net.leases(nid) == {"vni": network["vni"], "nat": await _nat(net, nid), f"vlan:{LEAF}": 2}
    await net.detach(tenant, second)
    assert (await calls(net, second))[1:] == [
        ("evpn", "detach", "PATCH", nvue, {"bridge": {"domain": {"br_default": {"vlan": {"2": None}}}},
                                           "interface": {"vlan2": None}, "vrf": {vrf: None}}),
        ("infiniband", "detach", "POST", f"{UFM}/actions/remove_guids_from_pkey", {"pkey": pkey, "guids": [g2]}),
        ("infiniband", "detach", "DELETE", f"{UFM}/resources/pkeys/{pkey}", None),
    ]
    assert f"vlan:{LEAF}" not in await net.leases(nid)


async def _nat(net: Net, nid: uuid.UUID) -> int:
    [row] = await net.fetch("SELECT value FROM pool_leases WHERE pool='nat' AND owner=$1", nid)
    return row["value"]


async def test_a_failed_attach_records_no_fabric_call(run_service, nc, watch):
    rt = await run_service("network", partial(build, plan=PLAN, fabric=fabric_from_env({})))
    net = Net(rt, nc.jetstream(), await watch("network.evt.>"))
    tenant, alloc = uuid.uuid4(), uuid.uuid4()
    nid = uuid.UUID((await net.create(tenant, "tiny", "10.81.0.0/29"))["data"]["network"]["network_id"])
    for _ in range(5):   # a /29 has 6 hosts: the gateway and five slots
        assert (await net.attach(tenant, nid, node=NODE_1))["type"] == "network.network_attached"
    refused = await net.attach(tenant, nid, alloc, NODE_1)
    assert refused["type"] == "network.network_attach_failed" and "subnet exhausted" in refused["data"]["reason"]
    assert await calls(net, alloc) == []
