"""/v1/networks end to end: the gateway and the network service running against real NATS and
PostgreSQL; writes travel as commands, reads come from the gateway's projection of network.* events."""
from __future__ import annotations

import ipaddress
import random
import uuid
from functools import partial

import pytest

from services.network.bootstrap import build as build_network
from services.network.domain.model import NetworkPlan
from tests.support.bus import send_command
from tests.support.commands import attach_cmd, detach_cmd
from tests.support.gateway import PROJECTED_WITHIN_S
from tests.support.polling import eventually


@pytest.fixture
async def network(run_service):
    return await run_service("network", build_network)


async def active(client, network_id: str, state: str = "active") -> dict:
    """The network once the gateway shows it in ``state`` (stopping at once should it show it rejected)."""
    async def shown() -> dict:
        return (await client.get(f"/v1/networks/{network_id}")).body
    return await eventually(shown, until=lambda body: body.get("state") == state, timeout=PROJECTED_WITHIN_S,
                            fail_if=lambda body: body.get("state") == "rejected", what=f"network {network_id} {state}")


async def create(client, name: str, cidr: str) -> dict:
    r = await client.post("/v1/networks", {"name": name, "cidr": cidr})
    assert r.status == 202, r.body
    return r.body


async def test_a_created_network_becomes_active_with_gateway_and_nat_and_is_invisible_to_other_tenants(api, network):
    client, tenant = await api.tenant_user()
    other, _ = await api.tenant_user()
    accepted = await create(client, "train", "10.10.0.0/24")
    assert accepted["state"] == "creating" and accepted["tenant_id"] == tenant
    shown = await active(client, accepted["id"])
    assert shown["gateway_ip"] == "10.10.0.1" and shown["nat_address"] and shown["rules"] == []
    assert [n["id"] for n in (await client.get("/v1/networks")).body["items"]] == [accepted["id"]]
    assert (await other.get(f"/v1/networks/{accepted['id']}")).status == 404
    assert (await other.delete(f"/v1/networks/{accepted['id']}")).status == 404
    assert (await other.get(f"/v1/networks/{accepted['id']}/attachments")).status == 404
    assert (await other.get("/v1/networks")).body["items"] == []
    same_cidr = await create(other, "train", "10.10.0.0/24")   # overlapping CIDRs across tenants are fine
    assert (await active(other, same_cidr["id"]))["gateway_ip"] == "10.10.0.1"


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "n", "cidr": "10.0.0.1/24"}, "cidr"), ({"name": "n", "cidr": "10.0.0.0/30"}, "cidr"),
    ({"name": "n", "cidr": "fd00::/64"}, "cidr"), ({"name": "n"}, "cidr"), ({"cidr": "10.0.0.0/24"}, "name"),
    ({"name": "bad name!", "cidr": "10.0.0.0/24"}, "name"), ({"name": "n", "cidr": "10.0.0.0/24", "vni": 5}, "vni"),
    ({"name": "n", "cidr": "10.0.0.0/24", "color": "red"}, "color"),
    ({"name": "n", "cidr": "230.165.236.64/27"}, "cidr"), ({"name": "n", "cidr": "240.0.0.0/16"}, "cidr"),   # multicast, reserved
    ({"name": "n", "cidr": "255.122.0.0/17"}, "cidr"), ({"name": "n", "cidr": "127.1.0.0/16"}, "cidr"),
    ({"name": "n", "cidr": "169.254.0.0/16"}, "cidr"), ({"name": "n", "cidr": "0.0.0.0/16"}, "cidr"),
    ({"name": "n", "cidr": "8.8.8.0/24"}, "cidr"),           # public: not allowed by default
])
async def test_a_bad_network_body_is_a_422_naming_the_field_and_creates_nothing(api, body, field):
    client, tenant = await api.tenant_user()
    r = await client.post("/v1/networks", body)
    assert r.status == 422 and r.content_type == "application/problem+json"
    assert field in [e["field"] for e in r.body["errors"]]
    assert await api.commands_of("network.create_network", tenant) == 0
    assert await api.scalar("SELECT count(*) FROM networks_view WHERE tenant_id=$1", uuid.UUID(tenant)) == 0


async def test_a_public_subnet_is_allowed_where_the_provider_allows_it_and_an_unusable_one_never(gateway, network):
    api = await gateway(allow_public_subnets=True)
    client, _ = await api.tenant_user()
    made = await create(client, "public", "203.0.113.0/24")
    assert (await active(client, made["id"]))["gateway_ip"] == "203.0.113.1"
    r = await client.post("/v1/networks", {"name": "mcast", "cidr": "230.165.236.64/27"})
    assert r.status == 422 and r.content_type == "application/problem+json"
    assert [e["field"] for e in r.body["errors"]] == ["cidr"] and "multicast" in r.body["errors"][0]["message"]


async def test_an_overlapping_network_or_a_taken_name_is_refused_before_anything_is_sent(api, network):
    client, tenant = await api.tenant_user()
    await active(client, (await create(client, "big", "10.0.0.0/16"))["id"])
    r = await client.post("/v1/networks", {"name": "inner", "cidr": "10.0.3.0/24"})
    assert r.status == 409 and r.body["errors"][0]["field"] == "cidr" and "'big'" in r.body["errors"][0]["message"]
    assert (await client.post("/v1/networks", {"name": "big", "cidr": "10.9.0.0/24"})).status == 409
    assert await api.commands_of("network.create_network", tenant) == 1


async def test_a_refusal_by_the_network_service_shows_as_rejected_with_its_reason(api, run_service):
    nat = f"100.{random.randint(64, 127)}.{random.randint(0, 255)}.0/30"   # two NAT addresses: two networks
    await run_service("network", partial(build_network, plan=NetworkPlan(nat_cidr=ipaddress.IPv4Network(nat))))
    client, _ = await api.tenant_user()
    ids = [(await create(client, f"n{i}", f"10.{i}.0.0/24"))["id"] for i in range(3)]
    states = {}
    for nid in ids:
        async def settled(nid=nid):
            body = (await client.get(f"/v1/networks/{nid}")).body
            return body if body["state"] != "creating" else None
        states[nid] = await eventually(settled, timeout=PROJECTED_WITHIN_S)
    rejected = [b for b in states.values() if b["state"] == "rejected"]
    assert len(rejected) == 1 and "NAT address pool exhausted" in rejected[0]["reason"]
    assert sorted(b["state"] for b in states.values()) == ["active", "active", "rejected"]


async def test_rules_go_active_and_away_and_a_rule_naming_another_tenants_network_is_a_422(api, network):
    client, tenant = await api.tenant_user()
    other, _ = await api.tenant_user()
    web, db = await create(client, "web", "10.1.0.0/24"), await create(client, "db", "10.2.0.0/24")
    foreign = await create(other, "web", "10.1.0.0/24")
    for n in (web, db):
        await active(client, n["id"])
    r = await client.post(f"/v1/networks/{db['id']}/rules", {"direction": "ingress", "protocol": "tcp",
                                                             "port_from": 5432, "remote_network_id": web["id"]})
    assert r.status == 202 and r.body["state"] == "adding"
    rule_id = r.body["id"]

    async def rules_once(state: str | None):
        """The rules once one is in ``state`` (None: once there are none left: then True)."""
        rules = (await client.get(f"/v1/networks/{db['id']}")).body["rules"]
        if state is None:
            return rules == []
        return rules if any(x["state"] == state for x in rules) else None
    [shown] = await eventually(lambda: rules_once("active"), timeout=PROJECTED_WITHIN_S)
    assert (shown["id"], shown["port_from"], shown["remote_network_id"]) == (rule_id, 5432, web["id"])
    answers = []
    for remote in (foreign["id"], str(uuid.uuid4())):
        bad = await client.post(f"/v1/networks/{db['id']}/rules", {"direction": "ingress", "remote_network_id": remote})
        answers.append((bad.status, bad.body["errors"]))
    assert answers[0] == answers[1] == (422, [{"field": "remote_network_id", "message": "no such network", "code": "rule"}])
    shape = await client.post(f"/v1/networks/{db['id']}/rules", {"direction": "egress", "protocol": "icmp", "port_from": 1})
    assert shape.status == 422 and {e["field"] for e in shape.body["errors"]} == {"port_from", "remote_cidr"}
    assert await api.commands_of("network.add_security_rule", tenant) == 1
    gone = await client.delete(f"/v1/networks/{db['id']}/rules/{rule_id}")
    assert gone.status == 202 and gone.body["state"] == "removing"
    await eventually(lambda: rules_once(None), timeout=PROJECTED_WITHIN_S)
    assert (await other.delete(f"/v1/networks/{db['id']}/rules/{rule_id}")).status == 404


async def test_attachments_are_listed_as_the_service_made_them_and_delete_waits_for_their_release(api, network, nc):
    client, tenant = await api.tenant_user()
    net = await create(client, "train", "10.3.0.0/24")
    await active(client, net["id"])
    alloc, node, js = uuid.uuid4(), uuid.uuid4(), nc.jetstream()
    await send_command(js, "network.attach_network", {**attach_cmd(alloc, uuid.UUID(tenant)), "node_id": node,
                                                      "network_id": net["id"]})

    async def listed():
        items = (await client.get(f"/v1/networks/{net['id']}/attachments")).body["items"]
        return items or None
    [item] = await eventually(listed, timeout=PROJECTED_WITHIN_S)
    async with network.pool.acquire() as conn:
        row = await conn.fetchrow("SELECT id, host(ip_address) AS ip, mac_address::text AS mac FROM attachments "
                                  "WHERE allocation_id=$1", alloc)
    assert (item["allocation_id"], item["attachment_id"], item["ip_address"], item["prefix_len"], item["mac_address"],
            item["node_id"]) == (str(alloc), str(row["id"]), row["ip"], 24, row["mac"], str(node))
    refused = await client.delete(f"/v1/networks/{net['id']}")
    assert refused.status == 409 and "attachments" in refused.body["detail"]
    await send_command(js, "network.detach_network", detach_cmd(alloc, uuid.UUID(tenant), uuid.uuid4()))

    async def emptied():
        return (await client.get(f"/v1/networks/{net['id']}/attachments")).body["items"] == []
    await eventually(emptied, timeout=PROJECTED_WITHIN_S)
    deleting = await client.delete(f"/v1/networks/{net['id']}")
    assert deleting.status == 202 and deleting.body["state"] == "deleting"
    await active(client, net["id"], "deleted")
    assert (await client.get("/v1/networks")).body["items"] == []
    assert await api.commands_of("network.delete_network", tenant) == 1


async def test_the_implicit_default_network_of_a_first_attach_is_listed_with_its_attachment(api, network, nc):
    client, tenant = await api.tenant_user()
    alloc, node = uuid.uuid4(), uuid.uuid4()
    await send_command(nc.jetstream(), "network.attach_network", {**attach_cmd(alloc, uuid.UUID(tenant)), "node_id": node})

    async def default_listed():
        items = (await client.get("/v1/networks")).body["items"]
        return items if items and items[0]["state"] == "active" else None
    [default] = await eventually(default_listed, timeout=PROJECTED_WITHIN_S)
    assert (default["name"], default["cidr"], default["gateway_ip"]) == ("default", "10.0.0.0/24", "10.0.0.1")

    async def attached():
        return (await client.get(f"/v1/networks/{default['id']}/attachments")).body["items"] or None
    [item] = await eventually(attached, timeout=PROJECTED_WITHIN_S)
    assert (item["allocation_id"], item["ip_address"], item["node_id"]) == (str(alloc), "10.0.0.2", str(node))
