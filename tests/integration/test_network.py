"""Network against real NATS JetStream and PostgreSQL: attach/detach steps, per-tenant VNIs and
addresses, exhaustion, tombstones, redelivery, dead-lettering, and concurrent attaches."""
from __future__ import annotations

import ipaddress
import random
import uuid
from functools import partial

import asyncpg

from services.network import handlers
from services.network.bootstrap import build
from services.network.contracts import AttachNetwork
from services.network.domain.model import NetworkPlan, VniPool
from shared.wire import step_key
from tests.support.bus import caused_by, of, send_malformed_then_valid, wait_handled
from tests.support.bus import send_command as send
from tests.support.commands import attach_cmd, detach_cmd
from tests.support.concurrency import run_handler_concurrently


async def attach(js, events, alloc: uuid.UUID, tenant: uuid.UUID) -> dict:
    await send(js, "network.attach_network", attach_cmd(alloc, tenant))
    [hit] = await events.wait_for(lambda i: i[1]["data"].get("allocation_id") == str(alloc) and "attach" in i[1]["type"])
    return hit[1]


async def attachments(rt, **where) -> list[asyncpg.Record]:
    (column, value), = where.items()
    async with rt.pool.acquire() as conn:
        return await conn.fetch(f"SELECT a.*, host(a.ip_address) AS ip, n.vni, n.tenant_id FROM attachments a "
                                f"JOIN tenant_networks n ON n.id = a.network_id WHERE {column}=$1", value)


async def test_attach_delivered_twice_gives_one_attachment_with_the_first_address_of_a_new_tenant_network(run_service, nc, watch):
    rt = await run_service("network", build)
    js, events = nc.jetstream(), await watch("network.evt.>")
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    env, _ = await send(js, "network.attach_network", attach_cmd(alloc, tenant))
    _, seq = await send(js, "network.attach_network", {}, env=env, msg_id=f"again-{env.id}")
    [hit] = await events.wait_for(of(alloc, "network.network_attached"))
    await wait_handled(js, "network", "network.attach_network", seq)
    data = hit[1]["data"]
    assert data["ip_address"] == "10.0.0.2" and data["vni"] >= 10_000   # 10.0.0.1 is the network's gateway
    [row] = await attachments(rt, allocation_id=alloc)
    assert (row["ip"], row["vni"], str(row["mac_address"]), row["id"]) == (
        "10.0.0.2", data["vni"], data["mac_address"], uuid.UUID(data["attachment_id"]))
    assert str(row["node_id"]) == env.data["node_id"]
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM tenant_networks WHERE tenant_id=$1", tenant) == 1
        assert str(await conn.fetchval("SELECT cidr FROM tenant_networks WHERE tenant_id=$1", tenant)) == "10.0.0.0/24"


async def test_a_tenant_shares_one_vni_and_tenants_get_distinct_vnis_with_overlapping_addresses(run_service, nc, watch):
    await run_service("network", build)
    js, events = nc.jetstream(), await watch("network.evt.>")
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    a = await attach(js, events, uuid.uuid4(), t1)
    b = await attach(js, events, uuid.uuid4(), t1)
    other = await attach(js, events, uuid.uuid4(), t2)
    assert (a["data"]["ip_address"], b["data"]["ip_address"]) == ("10.0.0.2", "10.0.0.3")
    assert a["data"]["vni"] == b["data"]["vni"] != other["data"]["vni"]
    assert other["data"]["ip_address"] == "10.0.0.2"
    assert a["data"]["mac_address"] != b["data"]["mac_address"]


async def test_detach_deletes_the_attachment_idempotently_and_frees_its_address(run_service, nc, watch):
    rt = await run_service("network", build)
    js, events = nc.jetstream(), await watch("network.evt.>")
    tenant, first, second = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await attach(js, events, first, tenant)
    await attach(js, events, second, tenant)
    saga = uuid.uuid4()
    for _ in range(2):
        env, _ = await send(js, "network.detach_network", detach_cmd(first, tenant, saga))
        [hit] = await events.wait_for(caused_by(env))
        assert hit[1]["type"] == "network.network_detached"
    assert await attachments(rt, allocation_id=first) == []
    again = await attach(js, events, uuid.uuid4(), tenant)
    assert again["data"]["ip_address"] == "10.0.0.2"


async def test_compensation_before_the_attach_leaves_a_tombstone_so_the_late_attach_fails(run_service, nc, watch):
    rt = await run_service("network", build)
    js, events = nc.jetstream(), await watch("network.evt.>")
    alloc, tenant, saga = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await send(js, "network.detach_network", detach_cmd(alloc, tenant, saga, compensates=step_key(saga, "attach_network")))
    await events.wait_for(of(alloc, "network.network_detached"))
    await send(js, "network.attach_network", attach_cmd(alloc, tenant, saga))
    [hit] = await events.wait_for(of(alloc, "network.network_attach_failed"))
    assert "compensated" in hit[1]["data"]["reason"]
    assert await attachments(rt, allocation_id=alloc) == []


async def test_an_exhausted_vni_pool_fails_the_attach_of_a_new_tenant_and_creates_no_network(run_service, nc, watch):
    vni = random.randint(16_000_000, 16_777_214)   # a two-VNI pool far above the default pool's lowest VNIs
    rt = await run_service("network", partial(build, plan=NetworkPlan(VniPool(vni, vni + 1))))
    js, events = nc.jetstream(), await watch("network.evt.>")
    first = await attach(js, events, uuid.uuid4(), uuid.uuid4())   # takes both: its L3 VNI and its network's VNI
    assert first["type"] == "network.network_attached" and first["data"]["vni"] in (vni, vni + 1)
    late_tenant, alloc = uuid.uuid4(), uuid.uuid4()
    refused = await attach(js, events, alloc, late_tenant)
    assert refused["type"] == "network.network_attach_failed"
    assert "VNI pool exhausted" in refused["data"]["reason"] and str(vni) in refused["data"]["reason"]
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM tenant_networks WHERE tenant_id=$1", late_tenant) == 0


async def test_an_exhausted_subnet_fails_the_attach_and_assigns_nothing(run_service, nc, watch):
    rt = await run_service("network", partial(build, plan=NetworkPlan(tenant_cidr=ipaddress.IPv4Network("10.9.0.0/30"))))
    js, events = nc.jetstream(), await watch("network.evt.>")
    tenant = uuid.uuid4()
    got = [(await attach(js, events, uuid.uuid4(), tenant))["data"]["ip_address"] for _ in range(1)]
    assert got == ["10.9.0.2"]   # a /30 has two hosts: the gateway and one slot
    alloc = uuid.uuid4()
    refused = await attach(js, events, alloc, tenant)
    assert refused["type"] == "network.network_attach_failed" and "subnet exhausted" in refused["data"]["reason"]
    assert await attachments(rt, allocation_id=alloc) == []


async def test_concurrent_attaches_never_give_an_address_or_a_vni_twice(run_service, provision):
    rt = await run_service("network", build)
    tenants = [uuid.uuid4() for _ in range(3)]
    cmds = [AttachNetwork(**attach_cmd(uuid.uuid4(), t)) for t in tenants for _ in range(8)]
    random.shuffle(cmds)
    await run_handler_concurrently(rt, await provision("network"), "network.attach_network", cmds,   # one transaction each
                                   lambda uow, cmd: handlers.attach_network(uow, cmd, plan=NetworkPlan()))
    vnis = set()
    for tenant in tenants:
        rows = await attachments(rt, tenant_id=tenant)
        expected = [ipaddress.IPv4Address(f"10.0.0.{i}") for i in range(2, 10)]
        assert sorted(ipaddress.IPv4Address(r["ip"]) for r in rows) == expected
        assert len({r["vni"] for r in rows}) == 1 and len({r["mac_address"] for r in rows}) == 8
        vnis |= {r["vni"] for r in rows}
    assert len(vnis) == 3


async def test_malformed_attach_is_dead_lettered_and_the_next_valid_one_is_still_handled(run_service, nc, watch):
    rt = await run_service("network", build)
    js, events = nc.jetstream(), await watch("network.evt.>")
    bad, good, tenant = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    dead = await send_malformed_then_valid(js, watch, "network.attach_network", attach_cmd(bad, tenant), "node_id",
                                           attach_cmd(good, tenant))
    assert dead == "deadletter.network.network__network_attach_network"
    await events.wait_for(of(good, "network.network_attached"))
    assert await attachments(rt, allocation_id=bad) == []
    assert len(await attachments(rt, allocation_id=good)) == 1
