"""A reschedule's network half against real NATS and PostgreSQL: an allocation detached from its failed node
and attached again on another keeps its address when it can, and the fabric drops the old port first."""
from __future__ import annotations

import json
import uuid
from functools import partial

import pytest

from services.network.bootstrap import build, fabric_from_env
from services.network.domain.model import LeafMap, NetworkPlan
from tests.support.network import Net

N1, N2 = uuid.uuid4(), uuid.uuid4()
LEAF_1, LEAF_2 = (f"leaf-{uuid.uuid4().hex[:8]}" for _ in range(2))   # leaves of this test alone
PLAN = NetworkPlan(leaves=LeafMap({N1: LEAF_1, N2: LEAF_2}))


@pytest.fixture
async def net(run_service, nc, watch) -> Net:
    rt = await run_service("network", partial(build, plan=PLAN, fabric=fabric_from_env({})))
    return Net(rt, nc.jetstream(), await watch("network.evt.>"))


async def network(net: Net, tenant: uuid.UUID, cidr: str) -> uuid.UUID:
    return uuid.UUID((await net.create(tenant, "train", cidr))["data"]["network"]["network_id"])


async def test_detach_on_the_failed_node_then_attach_on_another_keeps_the_address(net):
    tenant, alloc = uuid.uuid4(), uuid.uuid4()
    nid = await network(net, tenant, "10.70.0.0/24")
    await net.attach(tenant, nid, node=N1)                                   # a neighbour: 10.70.0.2
    first = await net.attach(tenant, nid, alloc, N1)
    assert (first["data"]["ip_address"], first["data"]["kept_address"]) == ("10.70.0.3", True)
    [(old_guid,)] = await net.fetch("SELECT guid FROM attachments WHERE allocation_id=$1", alloc)
    assert (await net.detach(tenant, alloc))["type"] == "network.network_detached"
    again = await net.attach(tenant, nid, alloc, N2, first["data"]["ip_address"])
    assert again["type"] == "network.network_attached"
    assert (again["data"]["ip_address"], again["data"]["kept_address"], again["data"]["node_id"]) == (
        "10.70.0.3", True, str(N2))
    assert again["data"]["attachment_id"] != first["data"]["attachment_id"]
    [row] = await net.fetch("SELECT host(ip_address) AS ip, node_id, leaf FROM attachments WHERE allocation_id=$1", alloc)
    assert (row["ip"], row["node_id"], row["leaf"]) == ("10.70.0.3", N2, LEAF_2)
    # the old port left the fabric before the new one joined: its GUID out of the tenant's partition, and the
    # network's VLAN stays on the old leaf only for the neighbour still there
    calls = await net.fetch("SELECT driver, action, method, url, body FROM fabric_calls WHERE allocation_id=$1 "
                            "ORDER BY seq", alloc)
    detached = [(c["driver"], c["url"].rsplit("/", 1)[-1], json.loads(c["body"])) for c in calls if c["action"] == "detach"]
    [(pkey,)] = await net.fetch("SELECT pkey FROM tenants WHERE tenant_id=$1", tenant)
    assert detached == [("infiniband", "remove_guids_from_pkey", {"pkey": f"0x{pkey:04x}", "guids": [old_guid]})]
    assert [c["url"] for c in calls if c["action"] == "attach"][-2:] == [
        f"https://{LEAF_2}:8765/nvue_v1/", "https://ufm.fabric.local/ufmRest/resources/pkeys"]


async def test_an_address_taken_meanwhile_or_outside_the_subnet_gives_the_next_free_one_and_says_so(net):
    tenant, alloc = uuid.uuid4(), uuid.uuid4()
    nid = await network(net, tenant, "10.71.0.0/24")
    old = (await net.attach(tenant, nid, alloc, N1))["data"]["ip_address"]
    await net.detach(tenant, alloc)
    thief = await net.attach(tenant, nid, node=N1)
    assert thief["data"]["ip_address"] == old
    again = await net.attach(tenant, nid, alloc, N2, old)
    assert (again["type"], again["data"]["ip_address"], again["data"]["kept_address"]) == (
        "network.network_attached", "10.71.0.3", False)
    outside = await net.attach(tenant, nid, uuid.uuid4(), N2, "10.99.0.3")
    assert (outside["data"]["ip_address"], outside["data"]["kept_address"]) == ("10.71.0.4", False)


async def test_an_allocation_not_yet_detached_from_its_old_node_is_not_attached_on_another(net):
    tenant, alloc = uuid.uuid4(), uuid.uuid4()
    nid = await network(net, tenant, "10.72.0.0/24")
    await net.attach(tenant, nid, alloc, N1)
    refused = await net.attach(tenant, nid, alloc, N2, "10.72.0.2")
    assert refused["type"] == "network.network_attach_failed" and f"still attached on node {N1}" in refused["data"]["reason"]
    [row] = await net.fetch("SELECT node_id FROM attachments WHERE allocation_id=$1", alloc)
    assert row["node_id"] == N1
