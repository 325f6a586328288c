"""Onboarding through the running service: the approval gate (declare, discover, approve a numbered
proposal), either order of declaration and discovery, the wipe-policy rule, re-discovery that differs
from the approved map (needs review, running allocations untouched), admin commands rejected with their
reason and no partial state, cordon and taints."""
from __future__ import annotations

import uuid

from services.node_agent.adapters.discovery.sim import sim_topology
from tests.support.bus import caused_by
from tests.support.bus import send_command as send
from tests.support.scheduler import start


async def test_a_registered_and_discovered_node_is_not_schedulable_until_its_proposal_is_approved(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    node = uuid.uuid4()
    topo = sim_topology(f"n-{node.hex}")
    await env.register(node)
    await env.report(node, topo.to_dict())
    doc = await env.node_event(node, lambda d: d["status"] == "pending_approval")
    assert doc["proposal"] == 1 and len(doc["proposed_slot_map"]["slots"]) == 8 and doc["free_slots"] == 0
    early = await env.reserve(tenant, fail_fast=True)
    assert early["type"] == "scheduler.slot_reservation_failed" and early["data"]["code"] == "no-capacity"
    await env.approve(node, doc["proposal"])
    approved = await env.node_event(node, lambda d: d["status"] == "schedulable")
    assert approved["free_slots"] == 8 and approved["proposal"] is None and approved["version"] > doc["version"]
    late = await env.reserve(tenant, fail_fast=True)
    assert late["type"] == "scheduler.slots_reserved" and late["data"]["node_id"] == str(node)


async def test_a_topology_reported_before_the_node_is_declared_onboards_the_same_way(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    node = uuid.uuid4()
    topo = sim_topology(f"n-{node.hex}", "pcie-l40s-4")
    await env.report(node, topo.to_dict())
    first = await env.node_event(node, lambda d: d["status"] == "pending_approval")
    assert first["name"] == f"undeclared-{node}" and first["gpu_count"] == 4
    await env.register(node, model="L40S", gpus=4, name=f"late-{node.hex[:8]}")
    declared = await env.node_event(node, lambda d: d["name"] == f"late-{node.hex[:8]}")
    assert (declared["status"], declared["pool"], declared["proposal"]) == ("pending_approval", env.pool, 1)
    await env.approve(node, 1)
    done = await env.node_event(node, lambda d: d["status"] == "schedulable")
    assert done["free_slots"] == 4 and [s["numa"] for s in done["approved_slot_map"]["slots"]] == [0, 0, 1, 1]


async def test_slots_approved_without_a_wipe_policy_are_never_schedulable(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    node = await env.onboard(wipe_policy="")
    doc = await env.node_event(node, lambda d: d["status"] == "schedulable")
    assert doc["free_slots"] == 0 and all(s["wipe_policy"] is None for s in doc["approved_slot_map"]["slots"])
    reply = await env.reserve(tenant, "vm.1gpu", fail_fast=True)
    assert reply["type"] == "scheduler.slot_reservation_failed" and reply["data"]["code"] == "no-capacity"
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM slots WHERE node_id=$1 AND allocation_id IS NOT NULL", node) == 0


async def test_invalid_admin_commands_are_rejected_with_their_reason_and_change_nothing(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    node = await env.onboard()
    before = await env.node_event(node)
    cases = [
        ("scheduler.approve_slot_map", {"node_id": node, "proposal": 1, "approved_by": uuid.uuid4()}, "no slot-map proposal"),
        ("scheduler.approve_slot_map", {"node_id": uuid.uuid4(), "proposal": 1, "approved_by": uuid.uuid4()}, "unknown node"),
        ("scheduler.report_topology", {"node_id": node, "driver": "sim", "topology": {"gpus": "eight"}}, "bad topology"),
        ("scheduler.update_node", {"node_id": node, "pool": "no-such-pool", "requested_by": uuid.uuid4()}, "unknown pool"),
        ("scheduler.register_node", {"node_id": uuid.uuid4(), "name": before["name"], "gpu_model": "H100",
                                     "gpu_count": 8, "pool": env.pool}, "is taken by node"),
        ("scheduler.define_shape", {"name": "vm.3gpu", "kind": "vm", "gpu_count": 3}, "1, 2, 4 or 8"),
        ("scheduler.set_quota", {"tenant_id": uuid.uuid4(), "gpu_model": "H100", "pool": env.pool, "limit": 2,
                                 "guaranteed": 4, "set_by": uuid.uuid4()}, "above the limit"),
    ]
    for type_, data, reason in cases:
        cmd, _ = await send(env.js, type_, data)
        [hit] = await env.events.wait_for(caused_by(cmd))
        assert hit[1]["type"] == "scheduler.admin_command_rejected" and reason in hit[1]["data"]["reason"], hit
        assert hit[1]["data"]["command"] == type_
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT version FROM nodes WHERE id=$1", node) == before["version"]
        assert await conn.fetchval("SELECT count(*) FROM shapes WHERE name='vm.3gpu'") == 0


async def test_rediscovery_missing_a_gpu_puts_the_node_into_review_and_keeps_its_allocation(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 16)
    node = await env.onboard()
    running = await env.reserve(tenant, "vm.2gpu")
    alloc = running["data"]["allocation_id"]
    topo = sim_topology(f"n-{node.hex}").to_dict()
    lost = topo["gpus"].pop(7)
    await env.report(node, topo)
    review = await env.node_event(node, lambda d: d["status"] == "needs_review")
    assert review["proposal"] == 2 and any(f"GPU {lost['pci']} missing" in r for r in review["review"])
    refused = await env.reserve(tenant, "vm.1gpu", fail_fast=True)
    assert refused["data"]["code"] == "no-capacity"
    assert len(await env.held(uuid.UUID(alloc))) == 2
    await env.approve(node, 2)
    back = await env.node_event(node, lambda d: d["status"] == "schedulable" and d["version"] > review["version"])
    assert back["free_slots"] == 5 and len(back["approved_slot_map"]["slots"]) == 7
    assert len(await env.held(uuid.UUID(alloc))) == 2


async def test_a_cordoned_node_gets_no_placement_and_uncordoning_places_the_waiting_request(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    node = await env.onboard()
    assert (await env.update(node, cordoned=True))["data"]["cordoned"] is True
    waiting = await env.reserve(tenant, "vm.4gpu")
    assert waiting["type"] == "scheduler.reservation_queued" and waiting["data"]["position"] == 1
    await env.update(node, cordoned=False)
    placed = await env.reply(waiting["data"]["allocation_id"], ("scheduler.slots_reserved",))
    assert placed["data"]["node_id"] == str(node) and placed["data"]["waited_s"] >= 0
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT status FROM step_outcomes WHERE idempotency_key=$1",
                                   placed["data"]["idempotency_key"]) == "done"
        assert await conn.fetchval("SELECT count(*) FROM pending WHERE allocation_id=$1",
                                   uuid.UUID(placed["data"]["allocation_id"])) == 0


async def test_a_tainted_node_takes_only_requests_that_tolerate_its_taint(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    node = await env.onboard()
    await env.update(node, taints={"dedicated": "team-a:NoSchedule"})
    plain = await env.reserve(tenant, "vm.1gpu", fail_fast=True)
    assert plain["data"]["code"] == "no-capacity"
    wrong = await env.reserve(tenant, "vm.1gpu", fail_fast=True, tolerations=["dedicated=team-b"])
    assert wrong["data"]["code"] == "no-capacity"
    tolerated = await env.reserve(tenant, "vm.1gpu", fail_fast=True, tolerations=["dedicated=team-a"])
    assert tolerated["type"] == "scheduler.slots_reserved" and tolerated["data"]["node_id"] == str(node)
