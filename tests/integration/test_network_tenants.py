"""Network service against real NATS and PostgreSQL: tenant networks, pools, releases and security rules.

Commands go over the bus as the gateway sends them; every assertion is on the events the
service publishes and on its schema."""
from __future__ import annotations

import uuid

import pytest

from services.network.bootstrap import build
from tests.support.network import Net


@pytest.fixture
async def net(run_service, nc, watch) -> Net:
    rt = await run_service("network", build)
    return Net(rt, nc.jetstream(), await watch("network.evt.>"))


async def test_two_tenants_may_use_the_same_cidr_and_get_distinct_vnis_nat_addresses_vrfs_and_pkeys(net):
    a, b = uuid.uuid4(), uuid.uuid4()
    ra, rb = await net.create(a, "web", "10.20.0.0/24"), await net.create(b, "web", "10.20.0.0/24")
    assert ra["type"] == rb["type"] == "network.network_created"
    na, nb = ra["data"]["network"], rb["data"]["network"]
    assert na["cidr"] == nb["cidr"] == "10.20.0.0/24" and na["gateway_ip"] == nb["gateway_ip"] == "10.20.0.1"
    assert na["vni"] != nb["vni"] and na["nat_address"] != nb["nat_address"] and na["vrf_table"] != nb["vrf_table"]
    snap_a = await net.snapshot_after(a, ra["data"]["version"])
    snap_b = await net.snapshot_after(b, rb["data"]["version"])
    assert snap_a["pkey"] != snap_b["pkey"] and [n["network_id"] for n in snap_a["networks"]] == [na["network_id"]]
    la, lb = await net.leases(a), await net.leases(b)
    assert la["vni"] not in (na["vni"], nb["vni"], lb["vni"])   # the L3 VNI is a VNI of its own


async def test_an_overlapping_network_of_the_same_tenant_is_rejected_and_leases_nothing(net):
    tenant, refused_id = uuid.uuid4(), uuid.uuid4()
    await net.create(tenant, "big", "10.30.0.0/16")
    r = await net.create(tenant, "inside", "10.30.4.0/24", refused_id)
    assert r["type"] == "network.command_rejected" and r["data"]["command"] == "create_network"
    assert "overlaps 10.30.0.0/16 of network 'big'" in r["data"]["reason"]
    assert await net.leases(refused_id) == {}
    assert len(await net.fetch("SELECT 1 FROM tenant_networks WHERE tenant_id=$1", tenant)) == 1
    bad = await net.create(tenant, "tiny", "10.99.0.0/30")
    assert bad["type"] == "network.command_rejected" and "outside /16../29" in bad["data"]["reason"]


@pytest.mark.parametrize("cidr", ["230.165.236.64/27", "255.122.0.0/17", "127.0.0.0/16", "169.254.0.0/16"])
async def test_a_subnet_no_host_can_use_is_rejected_by_the_network_service_too(net, cidr):
    tenant, refused_id = uuid.uuid4(), uuid.uuid4()
    r = await net.create(tenant, "unusable", cidr, refused_id)
    assert r["type"] == "network.command_rejected" and "no host can use it" in r["data"]["reason"]
    assert await net.leases(refused_id) == {}


async def test_repeating_a_create_changes_nothing_and_answers_created_again(net):
    tenant, nid = uuid.uuid4(), uuid.uuid4()
    first = await net.create(tenant, "web", "10.40.0.0/24", nid)
    again = await net.create(tenant, "web", "10.40.0.0/24", nid)
    assert again["type"] == "network.network_created" and again["data"]["network"] == first["data"]["network"]
    assert again["data"]["version"] == first["data"]["version"]


async def test_attach_to_a_named_network_uses_its_subnet_and_another_tenants_network_is_not_found(net):
    owner, intruder = uuid.uuid4(), uuid.uuid4()
    nid = uuid.UUID((await net.create(owner, "train", "172.16.8.0/24"))["data"]["network"]["network_id"])
    ok = await net.attach(owner, nid)
    assert ok["type"] == "network.network_attached" and ok["data"]["ip_address"] == "172.16.8.2"
    assert ok["data"]["attachment"]["network_id"] == str(nid) and ok["data"]["attachment"]["prefix_len"] == 24
    assert ok["data"]["tenant_networks"]["tenant_id"] == str(owner)
    alloc = uuid.uuid4()
    refused = await net.attach(intruder, nid, alloc)
    assert refused["type"] == "network.network_attach_failed" and refused["data"]["reason"] == "network not found"
    assert await net.fetch("SELECT 1 FROM attachments WHERE allocation_id=$1", alloc) == []
    assert await net.fetch("SELECT 1 FROM tenant_networks WHERE tenant_id=$1", intruder) == []


async def test_delete_is_refused_while_attached_then_releases_the_vni_nat_address_vrf_and_pkey(net):
    tenant, alloc = uuid.uuid4(), uuid.uuid4()
    created = await net.create(tenant, "solo", "10.50.0.0/24")
    nid = uuid.UUID(created["data"]["network"]["network_id"])
    await net.attach(tenant, nid, alloc)
    held = await net.leases(nid)
    assert set(held) >= {"vni", "nat"} and set(await net.leases(tenant)) == {"vrf", "pkey", "vni"}
    refused = await net.command("network.delete_network", {"network_id": nid, "tenant_id": tenant})
    assert refused["type"] == "network.command_rejected" and "still has 1 attachment(s)" in refused["data"]["reason"]
    assert (await net.detach(tenant, alloc))["type"] == "network.network_detached"
    assert await net.fetch("SELECT 1 FROM attachments WHERE allocation_id=$1", alloc) == []
    deleted = await net.command("network.delete_network", {"network_id": nid, "tenant_id": tenant})
    assert deleted["type"] == "network.network_deleted" and deleted["data"]["version"] > created["data"]["version"]
    assert await net.leases(nid) == {} and await net.leases(tenant) == {}
    [row] = await net.fetch("SELECT vrf_table, pkey, l3_vni FROM tenants WHERE tenant_id=$1", tenant)
    assert tuple(row) == (None, None, None)
    snap = await net.snapshot_after(tenant, deleted["data"]["version"])
    assert snap["networks"] == [] and snap["pkey"] is None


async def test_rules_between_a_tenants_networks_bump_the_version_and_publish_all_its_networks(net):
    tenant = uuid.uuid4()
    web = (await net.create(tenant, "web", "10.60.0.0/24"))["data"]["network"]["network_id"]
    db_created = await net.create(tenant, "db", "10.61.0.0/24")
    db = db_created["data"]["network"]["network_id"]
    rule = {"id": uuid.uuid4(), "direction": "ingress", "protocol": "tcp", "port_from": 5432, "remote_network_id": web}
    added = await net.command("network.add_security_rule", {"network_id": db, "tenant_id": tenant, "rule": rule})
    assert added["type"] == "network.security_rule_added" and added["data"]["version"] == db_created["data"]["version"] + 1
    snap = await net.snapshot_after(tenant, added["data"]["version"])
    by_id = {n["network_id"]: n for n in snap["networks"]}
    assert set(by_id) == {web, db} and by_id[web]["rules"] == []
    assert [(r["id"], r["port_from"], r["remote_network_id"]) for r in by_id[db]["rules"]] == [(str(rule["id"]), 5432, web)]
    removed = await net.command("network.remove_security_rule", {"network_id": db, "tenant_id": tenant,
                                                                  "rule_id": rule["id"]})
    assert removed["type"] == "network.security_rule_removed" and removed["data"]["version"] == added["data"]["version"] + 1
    snap = await net.snapshot_after(tenant, removed["data"]["version"])
    assert all(n["rules"] == [] for n in snap["networks"])


async def test_a_rule_naming_another_tenants_network_is_refused_exactly_like_a_missing_network(net):
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    db = (await net.create(mine, "db", "10.70.0.0/24"))["data"]["network"]["network_id"]
    foreign = (await net.create(theirs, "web", "10.71.0.0/24"))["data"]["network"]["network_id"]
    reasons = []
    for remote in (foreign, str(uuid.uuid4())):
        rule = {"id": uuid.uuid4(), "direction": "ingress", "protocol": "tcp", "remote_network_id": remote}
        r = await net.command("network.add_security_rule", {"network_id": db, "tenant_id": mine, "rule": rule})
        assert r["type"] == "network.command_rejected" and r["data"]["rule_id"] == str(rule["id"])
        reasons.append(r["data"]["reason"].replace(remote, "<id>"))
    assert reasons[0] == reasons[1] == "remote_network_id: <id>: network not found"
    into_theirs = {"id": uuid.uuid4(), "direction": "ingress", "protocol": "any", "remote_network_id": db}
    r = await net.command("network.add_security_rule", {"network_id": foreign, "tenant_id": mine, "rule": into_theirs})
    assert r["type"] == "network.command_rejected" and r["data"]["reason"] == "network not found"
    assert await net.fetch("SELECT 1 FROM security_rules WHERE network_id = ANY($1::uuid[])",
                           [uuid.UUID(db), uuid.UUID(foreign)]) == []


async def test_the_first_attach_without_a_network_creates_and_announces_the_tenants_default_network(net):
    tenant = uuid.uuid4()
    attached = await net.attach(tenant, None)
    snap = attached["data"]["tenant_networks"]
    [default] = snap["networks"]
    assert (default["name"], default["cidr"], default["gateway_ip"]) == ("default", "10.0.0.0/24", "10.0.0.1")
    assert attached["data"]["attachment"]["network_id"] == default["network_id"] and snap["version"] == 1
    [created] = await net.events.wait_for(lambda i: i[1]["type"] == "network.network_created"
                                          and i[1]["data"]["tenant_id"] == str(tenant))
    assert created[1]["data"]["network"] == default
    assert (await net.snapshot_after(tenant, 1))["networks"] == [default]
    again = await net.attach(tenant, None)
    assert again["data"]["attachment"]["network_id"] == default["network_id"] and again["data"]["ip_address"] == "10.0.0.3"


async def test_without_a_network_an_allocation_lands_on_a_default_network_that_overlaps_none_of_the_tenants(net):
    # the tenant made the provider's first choice (10.0.0.0/24) for production: the default goes next to it
    tenant = uuid.uuid4()
    assert (await net.create(tenant, "production", "10.0.0.0/24"))["type"] == "network.network_created"
    attached = await net.attach(tenant, None)
    assert attached["type"] == "network.network_attached", attached["data"]
    by_name = {n["name"]: n for n in attached["data"]["tenant_networks"]["networks"]}
    assert by_name["default"]["cidr"] == "10.0.1.0/24" and attached["data"]["ip_address"] == "10.0.1.2"
    # a tenant whose default network was deleted and a larger one made in its place
    other = uuid.uuid4()
    assert (await net.create(other, "everything", "10.0.0.0/16"))["type"] == "network.network_created"
    attached = await net.attach(other, None)
    assert attached["type"] == "network.network_attached", attached["data"]
    assert {n["name"]: n["cidr"] for n in attached["data"]["tenant_networks"]["networks"]} == {
        "everything": "10.0.0.0/16", "default": "10.1.0.0/24"}


async def test_a_network_the_tenant_named_default_is_its_default_network(net):
    tenant = uuid.uuid4()
    made = (await net.create(tenant, "default", "172.16.0.0/24"))["data"]["network"]
    attached = await net.attach(tenant, None)
    assert attached["data"]["attachment"]["network_id"] == made["network_id"]
    assert attached["data"]["ip_address"] == "172.16.0.2" and len(attached["data"]["tenant_networks"]["networks"]) == 1
