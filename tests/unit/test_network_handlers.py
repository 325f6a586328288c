"""Network's handlers over an in-memory repository, a recording fabric driver and a recording unit of work (no
I/O): what creating, deleting, attaching, detaching and rule commands store, lease, send to the fabric and emit."""
from __future__ import annotations

import ipaddress
import uuid

from services.network import contracts as c
from services.network import handlers
from services.network.domain.model import DEFAULT_NETWORK, NetworkPlan, VniPool
from shared.participant import COMPENSATED
from shared.wire import step_key
from tests.support.fakes import FakeUnitOfWork, factory
from tests.support.network_fakes import FakeNetworkRepository, RecordingFabric
from tests.support.steps import StepConnection

TENANT, NODE = uuid.uuid4(), uuid.uuid4()
PLAN = NetworkPlan()


async def command(handler, type_: str, cmd, repo: FakeNetworkRepository, **kw) -> FakeUnitOfWork:
    """Run a management handler as the consumer would; the unit of work records what it emitted."""
    uow = FakeUnitOfWork("network", type_, cmd)
    await handler(uow, cmd, repository=factory(repo), **kw)
    return uow


async def create(repo, name: str = "data", cidr: str = "10.8.0.0/24", *, plan: NetworkPlan = PLAN,
                 network_id: uuid.UUID | None = None, tenant: uuid.UUID = TENANT) -> FakeUnitOfWork:
    cmd = c.CreateNetwork(network_id=network_id or uuid.uuid4(), tenant_id=tenant, name=name, cidr=cidr)
    return await command(handlers.create_network, "network.create_network", cmd, repo, plan=plan)


def attach_cmd(alloc: uuid.UUID | None = None, *, network_id: uuid.UUID | None = None) -> c.AttachNetwork:
    saga = uuid.uuid4()
    return c.AttachNetwork(saga_id=saga, step="attach_network", idempotency_key=step_key(saga, "attach_network"),
                           allocation_id=alloc or uuid.uuid4(), tenant_id=TENANT, node_id=NODE, network_id=network_id)


def detach_cmd(attach: c.AttachNetwork, *, compensates: bool = False) -> c.DetachNetwork:
    return c.DetachNetwork(saga_id=attach.saga_id, step="detach_network",
                           idempotency_key=step_key(attach.saga_id, "detach_network"),
                           allocation_id=attach.allocation_id, tenant_id=TENANT,
                           compensates=attach.idempotency_key if compensates else None)


async def step(handler, type_: str, cmd, repo, conn: StepConnection, **kw) -> FakeUnitOfWork:
    """Run a saga-step handler through the participant kit (its outcomes kept by ``conn``)."""
    uow = FakeUnitOfWork("network", type_, cmd)
    uow.conn = conn
    await handler(uow, cmd, repository=factory(repo), **kw)
    return uow


# --- create and delete -----------------------------------------------------------------------------------------
async def test_create_network_leases_a_vni_and_nat_address_and_the_tenants_vrf_pkey_and_l3_vni():
    repo = FakeNetworkRepository()
    uow = await create(repo)
    assert uow.types() == ["network.tenant_networks_changed", "network.network_created"]
    created = uow.emitted[1].data
    assert (created["version"], created["network"]["name"], created["network"]["cidr"]) == (1, "data", "10.8.0.0/24")
    assert created["network"]["gateway_ip"] == "10.8.0.1" and created["network"]["nat_address"] == "198.51.100.1"
    res = repo.tenants[TENANT]
    assert (res.vrf_table, res.pkey, res.l3_vni, res.version) == (1000, 1, 10_000, 1)
    assert created["network"]["vni"] == 10_001 and repo.locked == [TENANT]


async def test_creating_the_same_network_again_answers_it_again_without_a_new_version_or_lease():
    repo, nid = FakeNetworkRepository(), uuid.uuid4()
    await create(repo, network_id=nid)
    leases = dict(repo.leases)
    again = await create(repo, network_id=nid)
    assert again.only("network.network_created").data["version"] == 1 and repo.leases == leases


async def test_a_network_id_of_another_tenant_is_rejected_without_naming_that_tenant():
    repo, nid = FakeNetworkRepository(), uuid.uuid4()
    await create(repo, network_id=nid, tenant=uuid.uuid4())
    rejected = (await create(repo, network_id=nid)).only("network.command_rejected").data
    assert rejected["reason"] == "network id already in use; choose another"


async def test_an_overlapping_subnet_is_rejected_and_leaves_no_lease_behind():
    repo = FakeNetworkRepository()
    await create(repo, "big", "10.8.0.0/16")
    leases = dict(repo.leases)
    rejected = (await create(repo, "small", "10.8.5.0/24")).only("network.command_rejected").data
    assert "overlaps 10.8.0.0/16" in rejected["reason"] and rejected["command"] == "create_network"
    assert repo.leases == leases and len(repo.networks) == 1


async def test_an_exhausted_vni_pool_rejects_the_network_and_the_savepoint_returns_the_tenants_leases():
    repo = FakeNetworkRepository()
    uow = await create(repo, plan=NetworkPlan(vnis=VniPool(10_000, 10_000)))   # the L3 VNI takes the only one
    assert "VNI pool exhausted" in uow.only("network.command_rejected").data["reason"]
    assert repo.leases == {} and repo.networks == {}


async def test_deleting_a_network_with_attachments_is_rejected_and_the_last_one_returns_the_tenants_ids():
    repo, conn = FakeNetworkRepository(), StepConnection()
    await step(handlers.attach_network, "network.attach_network", attach_cmd(), repo, conn, plan=PLAN)
    [default] = repo.networks.values()
    delete = c.DeleteNetwork(network_id=default.id, tenant_id=TENANT)
    uow = await command(handlers.delete_network, "network.delete_network", delete, repo)
    assert "still has 1 attachment(s)" in uow.only("network.command_rejected").data["reason"]
    repo.attachments.clear()
    uow = await command(handlers.delete_network, "network.delete_network", delete, repo)
    assert uow.types() == ["network.tenant_networks_changed", "network.network_deleted"]
    res = repo.tenants[TENANT]
    assert (res.vrf_table, res.pkey, res.l3_vni) == (None, None, None) and repo.leases == {}


# --- attach and detach (saga step) -----------------------------------------------------------------------------
async def test_the_first_attach_creates_the_tenants_default_network_and_gives_the_slot_the_first_host_after_the_gateway():
    repo, conn, fabric = FakeNetworkRepository(), StepConnection(), RecordingFabric()
    cmd = attach_cmd()
    uow = await step(handlers.attach_network, "network.attach_network", cmd, repo, conn, plan=PLAN, fabric=[fabric])
    assert uow.types() == ["network.tenant_networks_changed", "network.network_created", "network.network_attached"]
    [net] = repo.networks.values()
    assert (net.name, net.cidr, net.id in repo.defaults) == (DEFAULT_NETWORK, PLAN.tenant_cidr, True)
    reply = uow.emitted[-1].data
    assert reply["ip_address"] == str(ipaddress.IPv4Address(int(PLAN.tenant_cidr.network_address) + 2))
    assert reply["attachment"]["prefix_len"] == PLAN.tenant_cidr.prefixlen and conn.status(cmd.idempotency_key) == "done"
    [(action, call)] = fabric.sent     # the first slot of the tenant on its leaf: VRF and network in one patch
    assert action == "attach" and set(call.body) == {"vrf", "bridge", "interface"}


async def test_an_attach_repeated_under_its_key_or_another_gets_the_same_attachment():
    repo, conn = FakeNetworkRepository(), StepConnection()
    cmd = attach_cmd()
    first = (await step(handlers.attach_network, "network.attach_network", cmd, repo, conn, plan=PLAN)).emitted[-1]
    again = (await step(handlers.attach_network, "network.attach_network", cmd, repo, conn, plan=PLAN)).only(
        "network.network_attached")
    other = (await step(handlers.attach_network, "network.attach_network", attach_cmd(cmd.allocation_id), repo,
                        conn, plan=PLAN)).only("network.network_attached")
    assert first.data["attachment_id"] == again.data["attachment_id"] == other.data["attachment_id"]
    assert len(repo.attachments) == 1


async def test_an_allocation_still_attached_on_another_node_is_not_attached_there_too():
    repo = FakeNetworkRepository()
    conn, cmd = StepConnection(repo), attach_cmd()
    await step(handlers.attach_network, "network.attach_network", cmd, repo, conn, plan=PLAN)
    elsewhere = attach_cmd(cmd.allocation_id).model_copy(update={"node_id": uuid.uuid4()})
    uow = await step(handlers.attach_network, "network.attach_network", elsewhere, repo, conn, plan=PLAN)
    assert uow.only("network.network_attach_failed").data["reason"] == (
        f"allocation {cmd.allocation_id} is still attached on node {NODE}: "
        f"detach it there before attaching it on node {elsewhere.node_id}")
    [row] = repo.attachments.values()
    assert row.node_id == NODE


async def test_attaching_to_another_tenants_network_fails_as_not_found_and_creates_nothing():
    repo = FakeNetworkRepository()
    conn = StepConnection(repo)
    await create(repo, tenant=uuid.uuid4())
    [theirs] = repo.networks
    uow = await step(handlers.attach_network, "network.attach_network", attach_cmd(network_id=theirs), repo, conn,
                     plan=PLAN)
    assert uow.only("network.network_attach_failed").data["reason"] == "network not found"
    assert repo.attachments == {} and len(repo.networks) == 1


async def test_an_exhausted_subnet_fails_the_attach_and_the_step_savepoint_keeps_nothing_of_it():
    repo = FakeNetworkRepository()
    conn, plan = StepConnection(repo), NetworkPlan(tenant_cidr=ipaddress.IPv4Network("10.9.0.0/30"))
    await step(handlers.attach_network, "network.attach_network", attach_cmd(), repo, conn, plan=plan)
    before = repo.snapshot()
    uow = await step(handlers.attach_network, "network.attach_network", attach_cmd(), repo, conn, plan=plan)
    assert "subnet exhausted" in uow.only("network.network_attach_failed").data["reason"]
    assert repo.snapshot() == before


async def test_detach_removes_the_attachment_and_the_leafs_vlan_and_sends_the_fabric_what_only_it_needed():
    repo, conn, fabric = FakeNetworkRepository(), StepConnection(), RecordingFabric()
    cmd = attach_cmd()
    await step(handlers.attach_network, "network.attach_network", cmd, repo, conn, plan=PLAN, fabric=[fabric])
    uow = await step(handlers.detach_network, "network.detach_network", detach_cmd(cmd), repo, conn, fabric=[fabric])
    assert uow.only("network.network_detached").data["allocation_id"] == str(cmd.allocation_id)
    assert repo.attachments == {} and not any(pool.startswith("vlan:") for pool, _ in repo.leases)
    assert [action for action, _ in fabric.sent] == ["attach", "detach"]
    again = await step(handlers.detach_network, "network.detach_network", detach_cmd(cmd), repo, conn, fabric=[fabric])
    assert again.types() == ["network.network_detached"] and len(fabric.sent) == 2


async def test_a_compensated_attach_that_arrives_late_has_no_effect_and_answers_failure():
    repo, conn = FakeNetworkRepository(), StepConnection()
    cmd = attach_cmd()
    await step(handlers.detach_network, "network.detach_network", detach_cmd(cmd, compensates=True), repo, conn)
    uow = await step(handlers.attach_network, "network.attach_network", cmd, repo, conn, plan=PLAN)
    assert uow.only("network.network_attach_failed").data["reason"] == COMPENSATED
    assert repo.networks == {} and repo.attachments == {}


# --- security rules --------------------------------------------------------------------------------------------
def rule(**fields) -> c.SecurityRule:
    fields = {"direction": "egress", "remote_cidr": "203.0.113.0/24", **fields}
    return c.SecurityRule(id=uuid.uuid4(), protocol="tcp", port_from=443, port_to=443, **fields)


async def add(repo, network_id: uuid.UUID, r: c.SecurityRule) -> FakeUnitOfWork:
    return await command(handlers.add_security_rule, "network.add_security_rule",
                         c.AddSecurityRule(network_id=network_id, tenant_id=TENANT, rule=r), repo)


async def test_a_rule_is_added_with_a_new_version_and_a_repeat_is_answered_the_same_without_one():
    repo = FakeNetworkRepository()
    await create(repo)
    [nid] = repo.networks
    r = rule()
    uow = await add(repo, nid, r)
    assert uow.types() == ["network.tenant_networks_changed", "network.security_rule_added"]
    assert uow.emitted[-1].data["version"] == 2 and repo.rules[r.id] == (nid, r)
    assert (await add(repo, nid, r)).only("network.security_rule_added").data["version"] == 2


async def test_a_rule_id_used_on_another_network_or_a_rule_the_domain_refuses_is_rejected():
    repo = FakeNetworkRepository()
    await create(repo, "a", "10.8.0.0/24")
    await create(repo, "b", "10.9.0.0/24")
    a, b = repo.networks
    r = rule()
    await add(repo, a, r)
    taken = (await add(repo, b, r)).only("network.command_rejected").data
    assert taken["reason"] == "rule id already in use; choose another" and taken["rule_id"] == str(r.id)
    added = await add(repo, a, rule(direction="ingress", remote_cidr=None, remote_network_id=uuid.uuid4()))
    foreign = added.only("network.command_rejected").data
    assert foreign["command"] == "add_security_rule" and len(repo.rules) == 1


async def test_removing_a_rule_bumps_the_version_and_removing_one_that_is_not_there_is_answered_removed():
    repo = FakeNetworkRepository()
    await create(repo)
    [nid] = repo.networks
    r = rule()
    await add(repo, nid, r)
    remove = c.RemoveSecurityRule(network_id=nid, tenant_id=TENANT, rule_id=r.id)
    uow = await command(handlers.remove_security_rule, "network.remove_security_rule", remove, repo)
    assert uow.types() == ["network.tenant_networks_changed", "network.security_rule_removed"] and repo.rules == {}
    again = await command(handlers.remove_security_rule, "network.remove_security_rule", remove, repo)
    assert again.only("network.security_rule_removed").data["version"] == 3
