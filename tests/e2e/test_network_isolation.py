"""Tenant network isolation through the gateway and the saga, proven with real packets.

Three node-agents run with the kernel dataplane, each in its own "node" network
namespace; the namespaces share an underlay bridge (the lab). Allocations go
through the real saga: the network service assigns VNIs and addresses, the
node-agent plumbs bridges, VXLAN, veths, the tenant router and nftables. The
slots' namespaces stand in for the VMs' NICs.
"""
from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from services.node_agent.adapters.dataplane import probe
from services.node_agent.adapters.dataplane.lab import UNDERLAY_DEV, Lab
from services.node_agent.domain.dataplane.names import node_tag, slot_netns, slot_port_name, vxlan_name
from tests.support.polling import eventually

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0, reason="kernel networking needs root (namespaces, nftables)")]


@pytest.fixture(scope="module")
async def net_nodes(platform):
    """Three kernel-dataplane nodes in a tainted, spread pool; yields (pool options, node ids, lab, pool)."""
    lab = Lab(3, dataplanes=False)       # the node-agent processes drive the nodes
    pool = f"net-{uuid.uuid4().hex[:6]}"
    try:
        await asyncio.to_thread(lab.build)   # pyroute2's sync API runs an event loop of its own
        async with platform.admin() as admin:
            await admin.define_pool(pool, "spread", {"dedicated": f"{pool}:NoSchedule"})
            ids = []
            for i, ns in enumerate(lab.node_ns):
                env = {"TESSERA_NODE_DATAPLANE": "kernel", "TESSERA_NODE_NETNS": ns,
                       "TESSERA_NODE_UNDERLAY_DEV": UNDERLAY_DEV}
                ids.append(await platform.add_node(f"{pool}-{i}", env=env, pool=pool))
        lab.node_ids = [uuid.UUID(i) for i in ids]        # so destroy() also removes their slot namespaces
        yield {"pool": pool, "tolerations": [f"dedicated={pool}:NoSchedule"]}, ids, lab, pool
    finally:
        await asyncio.to_thread(lab.destroy)


async def granted(platform, pool: str, *tenants) -> None:
    async with platform.admin() as admin:
        for t in tenants:
            await admin.set_quota(t.id, pool, "H100", 64)


async def active(client, name: str, opts: dict, **extra) -> dict:
    a = await client.create_allocation(name, "vm.1gpu", **opts, **extra)
    return await client.wait_state(a["id"], "ACTIVE", timeout=90)


async def attachment_of(client, allocation: dict, network_id: str | None = None) -> dict:
    """The allocation's attachment as the API reports it (on its network, default if none given)."""
    if network_id is None:
        nets = (await client.request("GET", "/v1/networks"))[1]["items"]
        network_id = next(n["id"] for n in nets if n["name"] == "default")

    async def found() -> list[dict]:
        items = (await client.request("GET", f"/v1/networks/{network_id}/attachments"))[1]["items"]
        return [i for i in items if i["allocation_id"] == allocation["id"]]
    return (await eventually(found, timeout=15, what=f"an attachment of {allocation['id']} on network {network_id}"))[0]


def netns_of(att: dict) -> str:
    return slot_netns(node_tag(uuid.UUID(att["node_id"])), uuid.UUID(att["attachment_id"]))


def kernel_address(ns: str) -> tuple[str, str]:
    """(inet address/prefix, MAC) of eth0 in the slot namespace, as the kernel has them."""
    out = probe.run(None, "ip", "-n", ns, "-o", "addr", "show", "dev", "eth0").stdout
    inet = next(line.split()[3] for line in out.splitlines() if " inet " in line)
    mac = probe.run(None, "ip", "-n", ns, "-o", "link", "show", "dev", "eth0").stdout.split("link/ether ")[1].split()[0]
    return inet, mac


async def release_all(client, allocations: list[dict]) -> None:
    for a in allocations:
        await client.release(a["id"])
    for a in allocations:
        await client.wait_state(a["id"], "RELEASED", timeout=90)


async def test_a_tenants_slots_reach_each_other_across_nodes_and_another_tenant_with_the_same_cidr_cannot(
        platform, net_nodes, make_tenant):
    opts, _, _, pool = net_nodes
    a, b = await make_tenant(), await make_tenant()
    await granted(platform, pool, a, b)
    a1, a2 = await active(a.user, "a1", opts), await active(a.user, "a2", opts)
    b1, b2 = await active(b.user, "b1", opts), await active(b.user, "b2", opts)
    att = {k: await attachment_of(t.user, x) for k, t, x in
           (("a1", a, a1), ("a2", a, a2), ("b1", b, b1), ("b2", b, b2))}
    assert att["a1"]["node_id"] != att["a2"]["node_id"], "spread pool: the two slots are on different nodes"
    assert att["a2"]["ip_address"] == att["b2"]["ip_address"], "both tenants use 10.0.0.0/24 and the same addresses"
    for name, x in att.items():                                   # what the API reports is what the kernel has
        assert kernel_address(netns_of(x)) == (f"{x['ip_address']}/{x['prefix_len']}", x["mac_address"]), name

    ns = {k: netns_of(v) for k, v in att.items()}
    assert await asyncio.to_thread(probe.reaches, ns["a1"], att["a2"]["ip_address"])
    only_b = await asyncio.to_thread(probe.start, ns["b2"], probe.TCP_SERVER, att["b2"]["ip_address"], "7000")
    only_a = await asyncio.to_thread(probe.start, ns["a2"], probe.TCP_SERVER, att["a2"]["ip_address"], "7001")
    try:
        assert await asyncio.to_thread(probe.tcp_eventually, ns["a1"], att["a2"]["ip_address"], 7001)
        assert await asyncio.to_thread(probe.tcp_eventually, ns["b1"], att["b2"]["ip_address"], 7000)
        # the same address, guessed from the other tenant: A's port is never reached from B, nor B's from A
        assert not await asyncio.to_thread(probe.tcp_connects, ns["b1"], att["a2"]["ip_address"], 7001)
        assert not await asyncio.to_thread(probe.tcp_connects, ns["a1"], att["b2"]["ip_address"], 7000)
    finally:
        only_a.kill(), only_b.kill()
    await release_all(a.user, [a1, a2])
    await release_all(b.user, [b1, b2])
    left = set((await asyncio.to_thread(probe.run, None, "ip", "netns", "list")).stdout.split())
    assert not {n for n in ns.values()} & left, "a released slot's namespace is left"


async def test_two_networks_of_a_tenant_are_isolated_until_a_rule_opens_exactly_its_port(platform, net_nodes, tenant):
    opts, _, _, pool = net_nodes
    await granted(platform, pool, tenant)
    nets = {}
    for name, cidr in (("web", "10.1.0.0/24"), ("db", "10.2.0.0/24")):
        net = (await tenant.user.request("POST", "/v1/networks", json_body={"name": name, "cidr": cidr}))[1]

        async def shown(net=net) -> dict:
            return (await tenant.user.request("GET", f"/v1/networks/{net['id']}"))[1]
        net = await eventually(shown, until=lambda n: n["state"] == "active", fail_if=lambda n: n["state"] == "rejected",
                               timeout=15, what=f"network {name} active")
        assert net["state"] == "active", net
        nets[name] = net
    web = await active(tenant.user, "web-1", opts, network_id=nets["web"]["id"])
    db = await active(tenant.user, "db-1", opts, network_id=nets["db"]["id"])
    web_att = await attachment_of(tenant.user, web, nets["web"]["id"])
    db_att = await attachment_of(tenant.user, db, nets["db"]["id"])
    web_ns, db_ns, db_ip = netns_of(web_att), netns_of(db_att), db_att["ip_address"]
    servers = [await asyncio.to_thread(probe.start, db_ns, probe.TCP_SERVER, db_ip, p) for p in ("5432", "6000")]
    try:
        assert not await asyncio.to_thread(probe.tcp_connects, web_ns, db_ip, 5432)
        rule = (await tenant.user.request("POST", f"/v1/networks/{nets['db']['id']}/rules", json_body={
            "direction": "ingress", "protocol": "tcp", "port_from": 5432, "remote_network_id": nets["web"]["id"]}))[1]
        assert rule["state"] in ("adding", "active")
        assert await asyncio.to_thread(probe.tcp_eventually, web_ns, db_ip, 5432, 30.0)
        assert not await asyncio.to_thread(probe.tcp_connects, web_ns, db_ip, 6000)
    finally:
        for s in servers:
            s.kill()
    await release_all(tenant.user, [web, db])


async def test_reconcile_after_an_agent_restart_restores_a_deleted_interface_and_removes_a_stray_one(
        platform, net_nodes, tenant):
    opts, ids, lab, pool = net_nodes
    await granted(platform, pool, tenant)
    a1, a2 = await active(tenant.user, "r1", opts), await active(tenant.user, "r2", opts)
    att1, att2 = await attachment_of(tenant.user, a1), await attachment_of(tenant.user, a2)
    node = att1["node_id"]
    node_ns = lab.node_ns[ids.index(node)]
    port, stray = slot_port_name(uuid.UUID(att1["attachment_id"])), vxlan_name(0xFFFFFE)
    platform.kill(f"node_agent:{node}")
    for step in (("link", "del", port), ("link", "add", stray, "type", "bridge"),
                 ("link", "set", stray, "alias", "tessera:vxlan:stray")):
        await asyncio.to_thread(probe.run, None, "ip", "-n", node_ns, *step)
    await platform.restart(f"node_agent:{node}")

    async def links() -> str:
        return (await asyncio.to_thread(probe.run, None, "ip", "-n", node_ns, "-o", "link")).stdout
    repaired = await eventually(links, until=lambda out: port in out and stray not in out, timeout=20,
                                what=f"the agent to restore {port} and remove {stray}")
    assert port in repaired and stray not in repaired
    assert await asyncio.to_thread(probe.reaches, netns_of(att2), att1["ip_address"])
    await release_all(tenant.user, [a1, a2])
