"""A bare-metal server's switch port moved by the network service (real NATS, PostgreSQL and REAL packets): the server
(a namespace cabled to a Linux leaf's swp1) deploys on the provisioning network, its port moves to its tenant
network's VXLAN at hand-off (bind_port) and back for cleaning (unbind_port); the kernel leaf driver programs the leaf
(tooling.leaf_lab: a namespace on the VM-slice nodes' underlay), the VM slice is plumbed by the node-agent's kernel
dataplane on a node of the same underlay. Across the underlay the server and the tenant's VM slice reach each other;
another tenant's slice on the same subnet reaches neither; handed off, the server reaches no provisioning service;
being cleaned, it reaches nothing of the tenant. A refused move (the leaf has no such port, the port is on another
allocation's network, the address is answered for already) leaves the port where it was and nothing on the leaf.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from functools import partial

import pytest

from services.network.adapters.fabric import select
from services.network.bootstrap import build
from services.network.contracts import SlotAttachment, TenantNetworks
from services.network.domain.model import LeafMap, NetworkPlan
from services.node_agent.adapters.dataplane import probe
from services.node_agent.adapters.dataplane.lab import Lab, is_root
from shared.wire import step_key
from tests.support.bus import send_command
from tests.support.commands import detach_cmd
from tests.support.network import Net
from tooling.leaf_lab import PROVISIONING_VLAN, LeafLab

pytestmark = [pytest.mark.root, pytest.mark.skipif(not is_root(), reason="namespaces, veth and a leaf need root")]

VM_NODE, OTHER_NODE, BM_NODE = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
PROVISIONING_SERVICES = "172.30.250.1"
SERVER_PROVISIONING = "172.30.250.10/24"
HCA = "0x0002c903000e0b72"
TCP_PORT = 7070
SIDE = ("network.tenant_networks_changed", "network.network_created", "network.port_moved")


class World:
    """The underlay with two VM-slice nodes, a leaf, a server cabled to its swp1 and the provisioning services on its
    uplink; the plan maps the server's node to another leaf (the bind moves the attachment to the server's)."""

    def __init__(self) -> None:
        self.lab = Lab(2).build()
        s = self.lab.suffix
        self.leaf = LeafLab(f"leaf-{s}", f"tl{s}-leaf").build(self.lab.fabric, "ul", "10.255.0.250/24", "lf0")
        self.server, self.server2, self.services = f"tl{s}-srv", f"tl{s}-srv2", f"tl{s}-prov"
        for ns in (self.server, self.server2, self.services):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        self.leaf.cable("swp1", "eth0", peer_netns=self.server)
        self.leaf.cable("swp2", "eth0", peer_netns=self.server2)
        self.leaf.cable("prov0", "eth0", peer_netns=self.services)
        for ns, address in ((self.server, SERVER_PROVISIONING), (self.services, f"{PROVISIONING_SERVICES}/24")):
            probe.run(ns, "ip", "addr", "add", address, "dev", "eth0")
            probe.run(ns, "ip", "link", "set", "lo", "up")
        self.plan = NetworkPlan(leaves=LeafMap({VM_NODE: "leaf-vm", OTHER_NODE: "leaf-vm", BM_NODE: "leaf-guess"}))
        self.fabric = select(["evpn", "infiniband", "leaf"], leaf_netns={self.leaf.name: self.leaf.netns})
        self.listener = probe.start(self.services, probe.TCP_SERVER, PROVISIONING_SERVICES, str(TCP_PORT))

    def destroy(self) -> None:
        self.listener.kill()
        self.leaf.destroy()
        self.lab.destroy()   # the server's and the services' namespaces carry the lab's prefix

    def plumb(self, node: int, reply: dict) -> str:
        """The node-agent's part for a VM slice: its port on the node, from the attach reply; its namespace."""
        dp = self.lab.dataplanes[node]
        att = SlotAttachment(**reply["data"]["attachment"])
        dp.attach(TenantNetworks(**reply["data"]["tenant_networks"]), att)
        return dp.desired().slots[att.allocation_id].netns

    def serve_tenant_address(self, address: str, prefix: int) -> None:
        """What the server's seed does: its tenant address beside the provisioning one."""
        probe.run(self.server, "ip", "addr", "add", f"{address}/{prefix}", "dev", "eth0")
        probe.run(self.server, "ip", "link", "set", "eth0", "mtu", "1450", "up")


@pytest.fixture(scope="module")
def world():
    w = World()
    try:
        yield w
    finally:
        w.destroy()


def port_cmd(step: str, alloc: uuid.UUID, tenant: uuid.UUID, saga: uuid.UUID, port: str = "swp1", leaf=None,
             **extra) -> dict:
    return {"saga_id": saga, "step": step, "idempotency_key": step_key(saga, step), "allocation_id": alloc,
            "tenant_id": tenant, **extra} | ({"node_id": BM_NODE, "switch_port": {"leaf": leaf, "port": port},
                                              "hca_guids": [HCA]} if step == "bind_port" else {})


async def move(net: Net, type_: str, data: dict) -> dict:
    env, _ = await send_command(net.js, type_, data)
    return await net.result(env, SIDE)


async def detach(net: Net, tenant: uuid.UUID, alloc: uuid.UUID) -> dict:
    """network.detach_network (its port_moved, when it unbinds a server's port, is a side event)."""
    return await move(net, "network.detach_network", detach_cmd(alloc, tenant, uuid.uuid4()))


async def fabric_calls(net: Net, alloc: uuid.UUID, action: str) -> list[tuple]:
    rows = await net.fetch("SELECT driver, method, url, body FROM fabric_calls WHERE allocation_id=$1 AND action=$2 "
                           "ORDER BY seq", alloc, action)
    return [(r["driver"], r["method"], r["url"], json.loads(r["body"]) if r["body"] else None) for r in rows]


async def reaches(ns: str, ip: str) -> bool:
    return await asyncio.to_thread(probe.reaches, ns, ip)


async def never_reaches(ns: str, ip: str) -> bool:
    return await asyncio.to_thread(probe.never_reaches, ns, ip)


async def test_a_server_handed_off_joins_its_tenant_network_and_leaves_the_provisioning_one(world, run_service, nc,
                                                                                            watch):
    w = world
    rt = await run_service("network", partial(build, plan=w.plan, fabric=w.fabric))
    net = Net(rt, nc.jetstream(), await watch("network.evt.>"))
    tenant, other = uuid.uuid4(), uuid.uuid4()
    nid = uuid.UUID((await net.create(tenant, "train", "10.60.0.0/24"))["data"]["network"]["network_id"])
    oid = uuid.UUID((await net.create(other, "train", "10.60.0.0/24"))["data"]["network"]["network_id"])
    vm, bm, stranger = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    vm_ns = await asyncio.to_thread(w.plumb, 0, await net.attach(tenant, nid, vm, VM_NODE))
    stranger_ns = await asyncio.to_thread(w.plumb, 1, await net.attach(other, oid, stranger, OTHER_NODE,
                                                                        ip_address="10.60.0.50"))
    attached = (await net.attach(tenant, nid, bm, BM_NODE))["data"]
    await asyncio.to_thread(w.serve_tenant_address, attached["ip_address"], 24)
    vm_ip, bm_ip = "10.60.0.2", attached["ip_address"]

    # deploying: on the provisioning network only
    assert await reaches(w.server, PROVISIONING_SERVICES)
    assert await never_reaches(w.server, vm_ip)

    saga = uuid.uuid4()
    bound = await move(net, "network.bind_port", port_cmd("bind_port", bm, tenant, saga, leaf=w.leaf.name))
    assert bound["type"] == "network.port_bound", bound
    vlan = bound["data"]["vlan"]
    assert (bound["data"]["leaf"], bound["data"]["port"], bound["data"]["vni"]) == (w.leaf.name, "swp1", attached["vni"])
    assert w.leaf.port_vlans("swp1") == {vlan} != {PROVISIONING_VLAN}
    [row] = await net.fetch("SELECT leaf FROM attachments WHERE allocation_id=$1", bm)
    assert row["leaf"] == w.leaf.name                        # moved from the plan's guess to the server's leaf

    # handed off: the tenant's VM slice across the underlay, both ways, ICMP and TCP
    assert await reaches(w.server, vm_ip) and await reaches(vm_ns, bm_ip)
    server = await asyncio.to_thread(probe.start, vm_ns, probe.TCP_SERVER, vm_ip, str(TCP_PORT))
    try:
        assert await asyncio.to_thread(probe.tcp_eventually, w.server, vm_ip, TCP_PORT)
    finally:
        server.kill()
    # no provisioning service, no host address
    assert await never_reaches(w.server, PROVISIONING_SERVICES)
    assert not await asyncio.to_thread(probe.tcp_connects, w.server, PROVISIONING_SERVICES, TCP_PORT)
    assert await never_reaches(w.server, "10.255.0.1")
    # another tenant on the same subnet reaches neither, even re-addressed to a free address of the first tenant's
    assert await never_reaches(stranger_ns, bm_ip) and await never_reaches(stranger_ns, vm_ip)
    probe.run(stranger_ns, "ip", "addr", "add", "10.60.0.77/24", "dev", "eth0")
    assert await never_reaches(stranger_ns, bm_ip)

    # every fabric says the same move
    [evpn, ufm, *leaf] = await fabric_calls(net, bm, "bind")
    assert evpn[0] == "evpn" and evpn[3] == {"interface": {"swp1": {"bridge": {"domain": {"br_default": {"access": 2}}}}}}
    assert ufm[0] == "infiniband" and ufm[3]["guids"] == [HCA]
    assert leaf == [("leaf", "EXEC", f"netns:{w.leaf.netns}", {"argv": ["ip", "link", "set", "swp1", "master",
                                                                          f"br{vlan}"]})]

    # released: back on the provisioning network (cleaning), nothing of the tenant in reach
    unbound = await move(net, "network.unbind_port", port_cmd("unbind_port", bm, tenant, saga, compensates=None))
    assert unbound["type"] == "network.port_unbound" and unbound["data"]["port"] == "swp1"
    [evpn_back, ufm_back, leaf_back] = await fabric_calls(net, bm, "unbind")
    assert evpn_back[3] == {"interface": {"swp1": {"bridge": {"domain": {"br_default": {"access": PROVISIONING_VLAN}}}}}}
    assert ufm_back[2].endswith("/actions/remove_guids_from_pkey") and ufm_back[3]["guids"] == [HCA]
    assert leaf_back[3] == {"argv": ["ip", "link", "set", "swp1", "master", f"br{PROVISIONING_VLAN}"]}
    assert w.leaf.port_vlans("swp1") == {PROVISIONING_VLAN}
    assert await reaches(w.server, PROVISIONING_SERVICES)
    assert await never_reaches(w.server, vm_ip)
    await detach(net, tenant, bm)
    assert w.leaf.tessera_links() == []                           # the leaf served nothing else of the tenant
    await detach(net, tenant, vm)
    await detach(net, other, stranger)


async def test_a_refused_move_leaves_the_port_on_the_provisioning_network_and_nothing_on_the_leaf(world, run_service,
                                                                                                   nc, watch):
    w = world
    rt = await run_service("network", partial(build, plan=w.plan, fabric=w.fabric))
    net = Net(rt, nc.jetstream(), await watch("network.evt.>"))
    tenant, bm = uuid.uuid4(), uuid.uuid4()
    nid = uuid.UUID((await net.create(tenant, "train", "10.61.0.0/24"))["data"]["network"]["network_id"])
    attached = (await net.attach(tenant, nid, bm, BM_NODE))["data"]
    refused = await move(net, "network.bind_port", port_cmd("bind_port", bm, tenant, uuid.uuid4(), port="swp9",
                                                             leaf=w.leaf.name))
    assert refused["type"] == "network.port_bind_failed"
    assert f"leaf {w.leaf.name} has no port swp9" in refused["data"]["reason"]
    assert w.leaf.port_vlans("swp1") == {PROVISIONING_VLAN} and w.leaf.tessera_links() == []
    assert await net.fetch("SELECT 1 FROM port_bindings WHERE allocation_id=$1", bm) == []
    [row] = await net.fetch("SELECT leaf FROM attachments WHERE allocation_id=$1", bm)
    assert row["leaf"] == "leaf-guess"                       # the move to the server's leaf was rolled back too

    # a port on another tenant's network is refused; a detach of a bound server unbinds it first (a fence)
    first = await move(net, "network.bind_port", port_cmd("bind_port", bm, tenant, uuid.uuid4(), leaf=w.leaf.name))
    assert first["type"] == "network.port_bound"
    intruder = uuid.uuid4()
    await net.attach(tenant, nid, intruder, BM_NODE)
    taken = await move(net, "network.bind_port", port_cmd("bind_port", intruder, tenant, uuid.uuid4(),
                                                          leaf=w.leaf.name))
    assert taken["type"] == "network.port_bind_failed" and f"is on the tenant network of allocation {bm}" in \
        taken["data"]["reason"]
    await detach(net, tenant, intruder)

    # the address is taken: the bound server answers for the next server's address, whose port then stays put
    second = (await net.attach(tenant, nid, intruder, BM_NODE))["data"]["ip_address"]
    await asyncio.to_thread(w.serve_tenant_address, attached["ip_address"], 24)
    probe.run(w.server, "ip", "addr", "add", f"{second}/24", "dev", "eth0")
    taken = await move(net, "network.bind_port", port_cmd("bind_port", intruder, tenant, uuid.uuid4(), port="swp2",
                                                          leaf=w.leaf.name))
    assert taken["type"] == "network.port_bind_failed", taken
    server_mac = json.loads(probe.run(w.server, "ip", "-j", "link", "show", "eth0").stdout)[0]["address"]
    assert f"address {second} is already in use on the tenant network (answered by {server_mac})" in \
        taken["data"]["reason"]
    assert w.leaf.port_vlans("swp2") == {PROVISIONING_VLAN}
    assert w.leaf.port_vlans("swp1") == {first["data"]["vlan"]}      # the bound one is untouched
    probe.run(w.server, "ip", "addr", "flush", "dev", "eth0")
    probe.run(w.server, "ip", "addr", "add", SERVER_PROVISIONING, "dev", "eth0")
    await detach(net, tenant, intruder)
    await detach(net, tenant, bm)
    assert w.leaf.port_vlans("swp1") == {PROVISIONING_VLAN} and w.leaf.tessera_links() == []
    assert [c[1:] for c in await fabric_calls(net, bm, "unbind") if c[0] == "leaf"] == [
        ("EXEC", f"netns:{w.leaf.netns}", {"argv": ["ip", "link", "set", "swp1", "master", f"br{PROVISIONING_VLAN}"]})]
