"""Scheduling through the gateway and the saga, every service its own process.

Each test works in a pool of its own, tainted so that only requests tolerating
the taint land there: the package's other nodes and tests never interfere.
"""
from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support.polling import eventually
from tooling.client import ApiError

pytestmark = pytest.mark.timeout(240)


async def dedicated_pool(platform, admin, *tenants, nodes: int = 1, approve: bool = True, policy: str = "pack"):
    """A tainted pool with ``nodes`` fresh nodes, ``tenants`` granted 64 H100 there; returns (pool, node ids,
    scheduling options for requests)."""
    pool = f"p-{uuid.uuid4().hex[:8]}"
    await admin.define_pool(pool, policy, {"dedicated": f"{pool}:NoSchedule"})
    ids = [await platform.add_node(f"{pool}-{i}", approve=approve, pool=pool) for i in range(nodes)]
    for t in tenants:
        await admin.set_quota(t.id, pool, "H100", 64)
    return pool, ids, {"pool": pool, "tolerations": [f"dedicated={pool}:NoSchedule"]}


async def reserved_event(client, allocation_id: str) -> dict:
    """The scheduler.slots_reserved event of the allocation, from its event stream."""
    async def first():
        async for ev in client.events(allocation_id):
            if ev.get("type") == "scheduler.slots_reserved":
                return ev["data"]
    return await asyncio.wait_for(first(), 30)


async def test_a_node_takes_nothing_until_its_slot_map_is_approved_then_places_numa_aligned(platform, admin, tenant):
    pool, [node], opts = await dedicated_pool(platform, admin, tenant, approve=False)
    doc = await admin.wait_node(node, "pending_approval")
    slots = doc["proposed_slot_map"]["slots"]
    assert len(slots) == 8 and all(s["wipe_policy"] for s in slots)
    assert {s["numa"] for s in slots} == {0, 1}

    early = await tenant.user.create_allocation("early", "vm.1gpu", fail_fast=True, **opts)
    failed = await tenant.user.wait_state(early["id"], "FAILED")
    assert failed["failed_step"] == "reserve_slots"

    await admin.approve_node(node, doc["proposal"])
    await admin.wait_node(node, "schedulable")
    a = await tenant.user.create_allocation("aligned", "vm.4gpu", **opts)
    active = await tenant.user.wait_state(a["id"], "ACTIVE")
    assert active["node_id"] == node
    details = (await reserved_event(tenant.user, a["id"]))["slot_details"]
    assert len(details) == 4 and len({d["numa"] for d in details}) == 1 and len({d["nvlink_domain"] for d in details}) == 1
    await tenant.user.release(a["id"])
    await tenant.user.wait_state(a["id"], "RELEASED")


async def test_an_over_quota_request_is_refused_naming_the_quota_its_limit_and_use(platform, admin, tenant):
    pool, _, opts = await dedicated_pool(platform, admin)
    await admin.set_quota(tenant.id, pool, "H100", limit=2)
    a = await tenant.user.create_allocation("fits", "vm.2gpu", **opts)
    await tenant.user.wait_state(a["id"], "ACTIVE")
    async def quotas() -> dict:   # the gateway's view of the quota's use follows the scheduler's event
        return (await tenant.user.request("GET", f"/v1/tenants/{tenant.id}/quotas"))[1]
    await eventually(quotas, until=lambda q: any(x.get("used") == 2 for x in q["items"]), timeout=8,
                     what="the gateway to show 2 GPUs of the quota used")
    with pytest.raises(ApiError) as refused:
        await tenant.user.create_allocation("too-much", "vm.1gpu", **opts)
    problem = refused.value.problem
    assert refused.value.status == 403 and problem["type"].endswith("quota-exceeded")
    assert (problem["limit"], problem["used"], problem["requested"]) == (2, 2, 1) and pool in problem["quota"]
    await tenant.user.release(a["id"])
    await tenant.user.wait_state(a["id"], "RELEASED")


async def test_a_request_that_does_not_fit_waits_queued_and_is_placed_when_capacity_frees(platform, admin, tenant):
    pool, [node], opts = await dedicated_pool(platform, admin, tenant)
    big = await tenant.user.create_allocation("big", "vm.8gpu", **opts)
    await tenant.user.wait_state(big["id"], "ACTIVE")
    waiting = await tenant.user.create_allocation("waiting", "vm.2gpu", **opts)
    cancelled = await tenant.user.create_allocation("cancelled", "vm.1gpu", **opts)
    queued = await tenant.user.wait_state(waiting["id"], "QUEUED")
    assert queued["queue_position"] >= 1 and queued["queued_reason"]
    await tenant.user.wait_state(cancelled["id"], "QUEUED")
    await tenant.user.release(cancelled["id"])          # DELETE of a queued allocation cancels it
    gone = await tenant.user.wait_state(cancelled["id"], "FAILED")
    assert "cancel" in gone["reason"]

    await tenant.user.release(big["id"])
    await tenant.user.wait_state(big["id"], "RELEASED")
    placed = await tenant.user.wait_state(waiting["id"], "ACTIVE", timeout=90)
    assert placed["node_id"] == node
    await tenant.user.release(waiting["id"])
    await tenant.user.wait_state(waiting["id"], "RELEASED")


async def test_a_high_priority_request_preempts_a_spot_allocation_after_a_notice(platform, admin, make_tenant):
    spot_tenant, urgent_tenant = await make_tenant(), await make_tenant()
    pool, [node], opts = await dedicated_pool(platform, admin, spot_tenant, urgent_tenant)
    spot = await spot_tenant.user.create_allocation("spot", "vm.8gpu", spot=True, priority_class="low", **opts)
    await spot_tenant.user.wait_state(spot["id"], "ACTIVE")
    urgent = await urgent_tenant.user.create_allocation("urgent", "vm.4gpu", priority_class="high", **opts)

    noticed = await eventually(lambda: spot_tenant.user.allocation(spot["id"]), until=lambda a: a.get("preemption"),
                               fail_if=lambda a: a["state"] == "FAILED", timeout=30,
                               what="the spot allocation's preemption notice")
    assert noticed["preemption"]["reason"] and noticed["preemption"]["grace_deadline"]
    released = await spot_tenant.user.wait_state(spot["id"], "RELEASED", timeout=90)
    assert "preempt" in (released["reason"] or "")
    placed = await urgent_tenant.user.wait_state(urgent["id"], "ACTIVE", timeout=90)
    assert placed["node_id"] == node
    await urgent_tenant.user.release(urgent["id"])
    await urgent_tenant.user.wait_state(urgent["id"], "RELEASED")
