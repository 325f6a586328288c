"""The node-agent service with the REAL kernel dataplane (TESSERA_NODE_DATAPLANE=kernel), inside a one-node lab,
against real NATS JetStream and PostgreSQL: provision plumbs, deprovision unplumbs, tenant network changes
re-render the router's rules, and a restarted agent repairs kernel drift and reports each repair."""
from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from services.network.contracts import NetworkSnapshot, SecurityRule, SlotAttachment, TenantNetworks
from services.node_agent.adapters.dataplane import probe
from services.node_agent.adapters.dataplane.lab import Lab, is_root
from services.node_agent.adapters.drivers import SimDriver
from services.node_agent.bootstrap import build
from services.node_agent.domain.dataplane.names import vxlan_name
from shared.bus_identity import node_identity
from shared.settings import BusSettings, ServiceSettings
from tests.support.bus import of, publish_event
from tests.support.bus import send_to_node as send
from tests.support.commands import deprovision_node_cmd, provision_node_cmd
from tests.support.polling import eventually

needs_root = pytest.mark.skipif(not is_root(), reason="the kernel dataplane needs root (namespaces, veth, nftables)")


@pytest.fixture
async def kernel_agent(infra, provision):
    """(lab, start, stop): a one-node lab; start() runs the node-agent with TESSERA_NODE_DATAPLANE=kernel inside it."""
    lab = await asyncio.to_thread(Lab(1).build)    # pyroute2's sync API must not run on the event loop's thread
    dsn, running = await provision("node_agent"), []
    environ = {"TESSERA_NODE_DATAPLANE": "kernel", "TESSERA_NODE_NETNS": lab.node_ns[0],
               "TESSERA_NODE_UNDERLAY_DEV": "ul0", "TESSERA_NODE_RECONCILE_S": "3600"}

    async def start(driver: SimDriver | None = None):
        seed = infra.nkey_file(node_identity(lab.node_ids[0]))
        settings = ServiceSettings(service="node_agent", nats_url=infra.nats_url, nats_nkey_file=seed,
                                   db_dsn=dsn, instance=str(lab.node_ids[0]),
                                   bus=BusSettings(ack_wait_s=5, max_deliver=3, retry_backoff_s=[0.05, 0.1, 0.2]))
        rt = build(settings, driver=driver or SimDriver(), environ=environ)
        await rt.start()
        running.append(rt)
        return rt

    async def stop():
        await running.pop().stop()

    try:
        yield lab, start, stop
    finally:
        for rt in running:
            await rt.stop()
        await asyncio.to_thread(lab.destroy)


def tenant_of(vni: int) -> tuple[TenantNetworks, SlotAttachment, uuid.UUID]:
    net = NetworkSnapshot(network_id=uuid.uuid4(), name="a", vni=vni, cidr="10.90.0.0/24", gateway_ip="10.90.0.1", vrf_table=7)
    tenant = TenantNetworks(tenant_id=uuid.uuid4(), version=1, networks=[net])
    alloc = uuid.uuid4()
    att = SlotAttachment(attachment_id=uuid.uuid4(), allocation_id=alloc, network_id=net.network_id,
                         ip_address="10.90.0.10", prefix_len=24, mac_address="02:00:0a:5a:00:0a")
    return tenant, att, alloc


def plumbed_provision(node_id, tenant: TenantNetworks, att: SlotAttachment) -> dict:
    cmd = provision_node_cmd(node_id, att.allocation_id, uuid.uuid4())
    return cmd | {"tenant_id": tenant.tenant_id, "attachment": att.model_dump(mode="json"),
                  "tenant_networks": tenant.model_dump(mode="json")}


@needs_root
async def test_provision_with_an_attachment_plumbs_the_kernel_and_deprovision_removes_it(kernel_agent, nc, watch):
    lab, start, _ = kernel_agent
    rt, node_id, js = await start(), lab.node_ids[0], nc.jetstream()
    tenant, att, alloc = tenant_of(random.randint(1, 16_000_000))
    replies = await watch(f"node_agent.evt.*.{node_id}")
    await send(js, "provision", node_id, plumbed_provision(node_id, tenant, att))
    await replies.wait_for(of(alloc, "node_agent.node_provisioned"))
    dp = lab.dataplanes[0]            # the lab's own view of the node: reads the kernel the agent plumbed
    observed = await asyncio.to_thread(dp.observe)
    assert {k for k, _ in observed} == {"router", "bridge", "vxlan", "leg", "slot", "nft_node", "nft_router"}
    slot_ns = next(name for kind, name in observed if kind == "slot")
    assert f"link/ether {att.mac_address}" in probe.run(slot_ns, "ip", "-o", "link", "show", "eth0").stdout
    assert probe.reaches(slot_ns, "10.90.0.1")                        # its gateway, in the tenant's router
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM attachments WHERE node_id=$1 AND allocation_id=$2", node_id, alloc) == 1
    await send(js, "deprovision", node_id, deprovision_node_cmd(node_id, alloc, uuid.uuid4()))
    await replies.wait_for(of(alloc, "node_agent.node_deprovisioned"))
    assert await asyncio.to_thread(dp.observe) == {}
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM attachments WHERE node_id=$1 AND allocation_id=$2", node_id, alloc) == 0


@needs_root
async def test_agent_restarted_after_kernel_drift_repairs_it_on_start_and_reports_each_repair(kernel_agent, nc, watch):
    lab, start, stop = kernel_agent
    node_id, js = lab.node_ids[0], nc.jetstream()
    await start()
    tenant, att, alloc = tenant_of(random.randint(1, 16_000_000))
    replies = await watch(f"node_agent.evt.*.{node_id}")
    await send(js, "provision", node_id, plumbed_provision(node_id, tenant, att))
    await replies.wait_for(of(alloc, "node_agent.node_provisioned"))
    intact = await asyncio.to_thread(lab.dataplanes[0].observe)
    await stop()                                                        # the agent is gone; the kernel breaks meanwhile
    vni = tenant.networks[0].vni
    probe.run(lab.node_ns[0], "ip", "link", "del", vxlan_name(vni))
    stray = f"tvx{(vni + 1) % 0xFFFFFF:06x}"
    probe.run(lab.node_ns[0], "ip", "link", "add", stray, "type", "bridge")
    probe.run(lab.node_ns[0], "ip", "link", "set", stray, "alias", "tessera:vxlan:stray")
    await start()
    hits = await replies.wait_for(lambda i: i[1]["type"] == "node_agent.network_repaired" and len(
        [h for h in replies.items if h[1]["type"] == "node_agent.network_repaired"]) >= 2)
    repaired = {(h[1]["data"]["action"], h[1]["data"]["object"]) for h in hits}
    assert repaired == {("create", f"vxlan:{vxlan_name(vni)}"), ("remove", f"vxlan:{stray}")}
    assert all(h[0] == f"node_agent.evt.network_repaired.{node_id}" for h in hits)
    assert await asyncio.to_thread(lab.dataplanes[0].observe) == intact                        # exactly the desired state again


@needs_root
async def test_tenant_networks_changed_opens_the_rule_in_the_router_and_an_older_version_is_ignored(kernel_agent, nc, watch):
    lab, start, _ = kernel_agent
    rt, node_id, js = await start(), lab.node_ids[0], nc.jetstream()
    tenant, att, alloc = tenant_of(random.randint(1, 16_000_000))
    other = NetworkSnapshot(network_id=uuid.uuid4(), name="b", vni=random.randint(1, 16_000_000), cidr="10.91.0.0/24",
                            gateway_ip="10.91.0.1", vrf_table=7)
    tenant = tenant.model_copy(update={"networks": tenant.networks + [other]})
    replies = await watch(f"node_agent.evt.*.{node_id}")
    await send(js, "provision", node_id, plumbed_provision(node_id, tenant, att))
    await replies.wait_for(of(alloc, "node_agent.node_provisioned"))
    router = next(name for kind, name in await asyncio.to_thread(lab.dataplanes[0].observe) if kind == "router")
    rule = SecurityRule(id=uuid.uuid4(), direction="ingress", protocol="tcp", port_from=5432, port_to=5432,
                        remote_network_id=other.network_id)
    v2 = tenant.model_copy(update={"version": 2, "networks": [tenant.networks[0].model_copy(update={"rules": [rule]}), other]})

    async def publish(snapshot: TenantNetworks):
        env = await publish_event(js, "network.tenant_networks_changed", snapshot.model_dump(mode="json"),
                                  tenant_id=snapshot.tenant_id)
        return env.id

    def rules() -> str:
        return probe.run(router, "nft", "list", "table", "inet", "tessera").stdout

    assert "dport 5432" not in rules()
    handled = [await publish(v2)]
    await eventually(lambda: "dport 5432" in rules(), timeout=20, what="the router to open tcp/5432")
    handled.append(await publish(tenant))                               # version 1 again: stale, ignored
    async with rt.pool.acquire() as conn:
        await eventually(lambda: conn.fetchval("SELECT count(*) FROM inbox WHERE event_id = ANY($1::uuid[])", handled),
                         until=lambda count: count >= 2, timeout=20, what="both snapshots in the inbox")
        assert await conn.fetchval("SELECT version FROM tenant_networks WHERE node_id=$1 AND tenant_id=$2",
                                   node_id, tenant.tenant_id) == 2
    assert "dport 5432" in rules()


@needs_root
async def test_a_provision_the_driver_fails_leaves_no_network_and_no_row(kernel_agent, nc, watch):
    lab, start, _ = kernel_agent
    rt, node_id = await start(SimDriver(fail=["provision"])), lab.node_ids[0]
    tenant, att, alloc = tenant_of(random.randint(1, 16_000_000))
    replies = await watch(f"node_agent.evt.*.{node_id}")
    await send(nc.jetstream(), "provision", node_id, plumbed_provision(node_id, tenant, att))
    [failed] = await replies.wait_for(of(alloc, "node_agent.node_provision_failed"))
    assert "injected failure of provision" in failed[1]["data"]["reason"]
    assert await asyncio.to_thread(lab.dataplanes[0].observe) == {}
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM attachments WHERE node_id=$1", node_id) == 0


@needs_root
async def test_an_attachment_outside_its_network_fails_the_step_with_the_reason_and_plumbs_nothing(kernel_agent, nc, watch):
    lab, start, _ = kernel_agent
    rt, node_id = await start(), lab.node_ids[0]
    tenant, att, alloc = tenant_of(random.randint(1, 16_000_000))
    att = att.model_copy(update={"ip_address": "192.168.7.7"})
    replies = await watch(f"node_agent.evt.*.{node_id}")
    await send(nc.jetstream(), "provision", node_id, plumbed_provision(node_id, tenant, att))
    [failed] = await replies.wait_for(of(alloc, "node_agent.node_provision_failed"))
    assert failed[1]["data"]["reason"].startswith("network: ") and "is not in 10.90.0.0/24" in failed[1]["data"]["reason"]
    assert await asyncio.to_thread(lab.dataplanes[0].observe) == {}
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM attachments WHERE node_id=$1", node_id) == 0
        assert await conn.fetchval("SELECT count(*) FROM instances WHERE node_id=$1", node_id) == 0
