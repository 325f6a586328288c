"""Gangs through the running service (real NATS + PostgreSQL): placed whole with every member's slots claimed in
SQL, a member's own reserve answered from the gang's hold, a gang too big waiting while holding nothing, reloaded with
the index and placed by a release, cancelling, quota for the whole gang, and repeats answered with the recorded outcome."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from services.scheduler.adapters import claims
from tests.support.bus import caused_by
from tests.support.bus import send_command as send
from tests.support.scheduler import start

GANG_ANSWERS = ("scheduler.gang_placed", "scheduler.gang_queued", "scheduler.gang_rejected")


def gang_cmd(env, tenant: uuid.UUID, n: int, shape: str = "bm.8gpu", **kw) -> dict:
    return {"gang_id": uuid.uuid4(), "tenant_id": tenant, "shape": shape, "gpu_count": 8 if "8gpu" in shape else 1,
            "pool": env.pool, "members": [uuid.uuid4() for _ in range(n)], "requested_by": "paas", **kw}


async def ask(env, cmd: dict, types=GANG_ANSWERS) -> dict:
    """Send ``reserve_gang`` and return the answer it caused."""
    sent, _ = await send(env.js, "scheduler.reserve_gang", cmd)
    [hit] = await env.events.wait_for(lambda i: caused_by(sent)(i) and i[1]["type"] in types)
    return hit[1]


async def answer(env, gang_id, types) -> dict:
    hits = await env.events.wait_for(lambda i: i[1]["type"] in types and i[1]["data"].get("gang_id") == str(gang_id))
    return hits[-1][1]


async def test_a_gang_is_placed_whole_and_each_member_reserve_is_answered_from_its_hold(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 32)
    nodes = {await env.onboard(), await env.onboard()}
    cmd = gang_cmd(env, tenant, 2)
    placed = await ask(env, cmd)
    assert placed["type"] == "scheduler.gang_placed" and placed["tenant_id"] == str(tenant)
    members = placed["data"]["members"]
    assert [m["allocation_id"] for m in members] == [str(m) for m in cmd["members"]]
    assert {uuid.UUID(m["node_id"]) for m in members} == nodes and placed["data"]["racks"] == 1
    for m in cmd["members"]:                              # SQL holds every member's slots
        assert len(await env.held(m)) == 8
    again = await ask(env, cmd)                           # a repeat: the same answer, nothing claimed twice
    assert again["type"] == "scheduler.gang_placed" and again["data"]["members"] == members
    own = await env.reserve(tenant, "bm.8gpu", alloc=cmd["members"][0])   # the member's own allocate saga
    assert own["type"] == "scheduler.slots_reserved"
    assert (own["data"]["node_id"], own["data"]["slots"]) == (members[0]["node_id"], members[0]["slots"])
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1 AND pool=$2", tenant, env.pool) == 16
    await env.release(cmd["members"][1])                  # a member is released the ordinary way
    assert await env.held(cmd["members"][1]) == [] and len(await env.held(cmd["members"][0])) == 8


async def test_a_gang_too_big_waits_holding_nothing_and_is_placed_when_an_allocation_is_released(
        run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 32)
    await env.onboard()
    await env.onboard()
    blocker = await env.reserve(tenant, "vm.1gpu")
    cmd = gang_cmd(env, tenant, 2)
    queued = await ask(env, cmd)
    assert queued["type"] == "scheduler.gang_queued" and "waits whole" in queued["data"]["reason"]
    for m in cmd["members"]:
        assert await env.held(m) == []                    # half a gang never holds GPUs
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT state FROM gangs WHERE gang_id=$1", cmd["gang_id"]) == "queued"
    assert (await ask(env, cmd))["type"] == "scheduler.gang_queued"      # a repeat: still one waiting gang
    assert len(env.rt.scheduler.sched.queue) == 1
    await env.rt.scheduler.load(env.rt.pool)              # as a new leader does: the waiting gang is reloaded
    assert env.rt.scheduler.sched.gangs.keys() == {cmd["gang_id"]}
    await env.release(uuid.UUID(blocker["data"]["allocation_id"]))
    placed = await answer(env, cmd["gang_id"], ("scheduler.gang_placed",))
    assert placed["correlation_id"] == queued["correlation_id"] and len(placed["data"]["members"]) == 2
    for m in cmd["members"]:
        assert len(await env.held(m)) == 8


async def test_a_waiting_gang_can_be_cancelled_and_a_gang_over_quota_is_rejected_naming_the_quota(
        run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 17)
    await env.onboard()
    await env.onboard()
    over = await ask(env, gang_cmd(env, tenant, 3))
    assert over["type"] == "scheduler.gang_rejected" and over["data"]["code"] == "quota-exceeded"
    assert (over["data"]["limit"], over["data"]["requested"]) == (17, 24)
    blocker = await env.reserve(tenant, "vm.1gpu")
    cmd = gang_cmd(env, tenant, 2)
    assert (await ask(env, cmd))["type"] == "scheduler.gang_queued"
    await send(env.js, "scheduler.cancel_gang", {"gang_id": cmd["gang_id"], "tenant_id": tenant,
                                                 "requested_by": "paas"})
    cancelled = await answer(env, cmd["gang_id"], ("scheduler.gang_rejected",))
    assert cancelled["data"]["code"] == "cancelled"
    await env.release(uuid.UUID(blocker["data"]["allocation_id"]))
    assert not env.rt.scheduler.sched.gangs and len(env.rt.scheduler.sched.queue) == 0
    again = await ask(env, cmd)                           # a repeat: the recorded rejection
    assert again["type"] == "scheduler.gang_rejected" and again["data"]["code"] == "cancelled"
    for m in cmd["members"]:
        assert await env.held(m) == []


async def test_claim_all_makes_every_claim_or_none_and_names_the_one_refused(run_service, nc, watch):
    """A gang's members are claimed in one round trip: when one member's slots are taken, the members claimed
    before it are undone too, and the refusal names that member's claim."""
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 16)
    node = await env.onboard()

    def member(slots: tuple[int, ...]) -> claims.Claim:
        return claims.Claim(uuid.uuid4(), tenant, None, node, slots, "vm.1gpu", "H100", env.pool, len(slots))

    clash = [member((0,)), member((1,)), member((1,))]      # the third wants the second's slot
    async with env.rt.pool.acquire() as conn:
        tx = conn.transaction()      # rolled back at the end: the running scheduler's index never saw these claims
        await tx.start()
        with pytest.raises(claims.SlotTaken) as refused:
            await claims.claim_all(conn, clash)
        assert refused.value.claim is clash[2]
        assert await conn.fetchval("SELECT count(*) FROM allocations WHERE node_id=$1", node) == 0
        assert await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1", tenant) == 0
        capacity = await claims.claim_all(conn, clash[:2])
        assert capacity[node]["free_slots"] == 6
        assert await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1", tenant) == 2
        await tx.rollback()


async def test_gangs_sent_together_are_each_placed_whole_on_slots_no_other_holds(run_service, nc, watch):
    """Gangs arriving together may be decided in one batch, their members' claims made together: each gang is
    still placed whole, SQL holds every member where its answer says, and no node is given twice."""
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 64)
    for _ in range(6):
        await env.onboard()
    cmds = [gang_cmd(env, tenant, 2) for _ in range(3)]
    answers = await asyncio.gather(*(ask(env, cmd) for cmd in cmds))
    assert [a["type"] for a in answers] == ["scheduler.gang_placed"] * 3
    nodes = [m["node_id"] for a in answers for m in a["data"]["members"]]
    assert len(set(nodes)) == 6
    for a in answers:
        for m in a["data"]["members"]:
            held = await env.held(uuid.UUID(m["allocation_id"]))
            assert held == [(uuid.UUID(m["node_id"]), s) for s in sorted(m["slots"])] and len(held) == 8
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1 AND pool=$2", tenant, env.pool) == 48
