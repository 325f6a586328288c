"""Failures handled without a human, every service its own process: a fatal XID on a node with three tenants'
allocations, and a node whose agent and guests die, each bring every allocation back ACTIVE on a healthy node
under the same id, with events the tenant sees, the old instance fenced and the meter paused for the gap.

Each test works in a tainted pool of two fresh nodes of its own (half of a two-node pool may be cordoned
automatically before the breaker opens), so the package's other nodes and tests never interfere."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support.bus import publish_from_node
from tests.support.polling import eventually

pytestmark = pytest.mark.timeout(300)


async def pool_of_two(platform, admin, tenants):
    pool = f"fo-{uuid.uuid4().hex[:8]}"
    await admin.define_pool(pool, "pack", {"dedicated": f"{pool}:NoSchedule"})
    ids = [await platform.add_node(f"{pool}-{i}", pool=pool) for i in range(2)]
    for t in tenants:
        await admin.set_quota(t.id, pool, "H100", 16)
    return ids, {"pool": pool, "tolerations": [f"dedicated={pool}:NoSchedule"]}


async def three_on_one_node(platform, admin, make_tenant):
    """Three tenants, one vm.2gpu allocation each, all ACTIVE on one node of a fresh pool (it packs); returns
    (tenants, allocations, that node, the other node)."""
    tenants = [await make_tenant() for _ in range(3)]
    ids, opts = await pool_of_two(platform, admin, tenants)
    allocs = [await t.user.create_allocation(f"fo-{i}", "vm.2gpu", **opts) for i, t in enumerate(tenants)]
    active = [await t.user.wait_state(a["id"], "ACTIVE") for t, a in zip(tenants, allocs)]
    [bad] = {a["node_id"] for a in active}
    [good] = set(ids) - {bad}
    return tenants, active, bad, good


async def moved(tenant, alloc: dict, good: str) -> dict:
    """The allocation once it is ACTIVE again on ``good`` (same id)."""
    return await eventually(lambda: tenant.user.allocation(alloc["id"]), timeout=120,
                            until=lambda a: a["state"] == "ACTIVE" and a["node_id"] == good,
                            fail_if=lambda a: a["state"] in ("FAILED", "RELEASED"),
                            what=f"allocation {alloc['id']} ACTIVE on {good}")


async def told(tenant, allocation_id: str) -> dict[str, dict]:
    """The interruption and reschedule events in the allocation's own event stream (what the tenant sees)."""
    seen: dict[str, dict] = {}

    async def read():
        async for ev in tenant.user.events(allocation_id):
            if ev.get("type") in ("allocation.interrupted", "allocation.rescheduled"):
                seen[ev["type"]] = ev["data"]
            if len(seen) == 2:
                return seen
    return await asyncio.wait_for(read(), 60)


async def fenced(db, node: str, allocation_ids: list[str]) -> None:
    """No instance of these allocations is kept on the old node any more."""
    await eventually(lambda: db.fetchval("SELECT count(*) FROM node_agent.instances WHERE node_id = $1 AND "
                                         "allocation_id = ANY($2::uuid[])", uuid.UUID(node),
                                         [uuid.UUID(a) for a in allocation_ids]),
                     timeout=60, until=lambda n: n == 0, what=f"instances fenced on {node}")


async def test_a_fatal_xid_moves_three_tenants_allocations_to_a_healthy_node(platform, admin, make_tenant,
                                                                             platform_nc, db):
    tenants, active, bad, good = await three_on_one_node(platform, admin, make_tenant)
    await publish_from_node(platform_nc, "node_agent.inject_fault", bad, {
        "node_id": bad, "kind": "xid", "gpu": 0, "code": 79, "request_id": str(uuid.uuid4())})
    again = [await moved(t, a, good) for t, a in zip(tenants, active)]
    assert [a["id"] for a in again] == [a["id"] for a in active]
    for t, a in zip(tenants, active):
        events = await told(t, a["id"])
        assert events["allocation.interrupted"]["node_id"] == bad
        assert events["allocation.interrupted"]["category"] == "gpu_fault"
        rescheduled = events["allocation.rescheduled"]
        assert (rescheduled["from_node_id"], rescheduled["to_node_id"]) == (bad, good) and rescheduled["gap_s"] >= 0
    node = await admin.node(bad)
    assert node["cordoned"]
    await fenced(db, bad, [a["id"] for a in active])
    # the tenant is not billed for the gap: two meter segments, none running across it
    for a in active:
        segments = await db.fetch("SELECT started_at, stopped_at FROM billing.meters WHERE allocation_id = $1 "
                                  "ORDER BY started_at", uuid.UUID(a["id"]))
        assert len(segments) == 2 and segments[0]["stopped_at"] <= segments[1]["started_at"]
    for t, a in zip(tenants, active):
        await t.user.release(a["id"])
        await t.user.wait_state(a["id"], "RELEASED")


async def test_a_node_whose_agent_and_guests_die_has_its_allocations_moved_and_fenced_when_it_returns(
        platform, admin, make_tenant, db):
    tenants, active, bad, good = await three_on_one_node(platform, admin, make_tenant)
    platform.kill(f"node_agent:{bad}")          # the sim guests live in the agent: they die with it
    again = [await moved(t, a, good) for t, a in zip(tenants, active)]
    assert {a["id"] for a in again} == {a["id"] for a in active}
    events = await told(tenants[0], active[0]["id"])
    assert events["allocation.interrupted"]["category"] == "node_lost"
    await platform.restart(f"node_agent:{bad}")  # it answers again: what it kept of the moved ones is fenced
    await fenced(db, bad, [a["id"] for a in active])
    await eventually(lambda: admin.node(bad), timeout=60, until=lambda n: not n["cordoned"],
                     what="the node uncordoned once it answers and holds nothing placed elsewhere")
    for t, a in zip(tenants, active):
        await t.user.release(a["id"])
        await t.user.wait_state(a["id"], "RELEASED")


async def test_an_interrupted_allocation_that_fits_nowhere_waits_in_the_queue_and_moves_when_room_frees(
        platform, admin, make_tenant, platform_nc):
    owner, crowd = await make_tenant(), await make_tenant()
    ids, opts = await pool_of_two(platform, admin, [owner, crowd])
    full = [await crowd.user.create_allocation(f"full-{i}", "vm.2gpu", **opts) for i in range(4)]
    full = [await crowd.user.wait_state(a["id"], "ACTIVE") for a in full]
    [busy] = {a["node_id"] for a in full}                       # the pool packs: one node full
    alloc = await owner.user.wait_state((await owner.user.create_allocation("mine", "vm.2gpu", **opts))["id"],
                                        "ACTIVE")
    [bad] = set(ids) - {busy}
    assert alloc["node_id"] == bad
    await publish_from_node(platform_nc, "node_agent.inject_fault", bad, {
        "node_id": bad, "kind": "xid", "gpu": 0, "code": 48, "request_id": str(uuid.uuid4())})
    waiting = await eventually(lambda: owner.user.allocation(alloc["id"]), timeout=60,
                               until=lambda a: a["state"] == "INTERRUPTED" and a.get("queue_position"),
                               fail_if=lambda a: a["state"] in ("FAILED", "RELEASED"),
                               what="the interrupted allocation waiting in the queue, its place shown")
    assert waiting["queue_position"] == 1 and waiting["interruption"]["category"] == "gpu_fault"
    await crowd.user.release(full[0]["id"])                     # room on the healthy node
    back = await moved(owner, alloc, busy)
    assert back["id"] == alloc["id"] and back.get("queue_position") is None
    for t, a in [(owner, alloc), *[(crowd, f) for f in full[1:]]]:
        await t.user.release(a["id"])
        await t.user.wait_state(a["id"], "RELEASED")
