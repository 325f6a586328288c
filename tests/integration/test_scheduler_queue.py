"""The pending queue through the running service: a queued request is placed (and its reply recorded)
when capacity frees up, a pending request can be cancelled, one tenant's flood is bounded and does not
delay another tenant, and a standby replica takes over when the leader's database session dies."""
from __future__ import annotations

import asyncio
import uuid

from services.scheduler.bootstrap import build
from services.scheduler.settings import SchedulerSettings
from tests.support.bus import caused_by
from tests.support.bus import send_command as send
from tests.support.polling import eventually
from tests.support.scheduler import start


async def test_a_queued_request_is_placed_after_a_release_and_a_repeat_gets_the_recorded_reply(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 16)
    node = await env.onboard()
    whole = await env.reserve(tenant, "vm.8gpu")
    cmd = env.reserve_cmd(tenant, "vm.2gpu")
    await send(env.js, "scheduler.reserve_slots", cmd)
    queued = await env.reply(cmd["allocation_id"])
    assert queued["type"] == "scheduler.reservation_queued" and queued["data"]["reason"].startswith("no capacity")
    again, _ = await send(env.js, "scheduler.reserve_slots", cmd)      # the saga resending while it waits
    [still] = await env.events.wait_for(caused_by(again))
    assert still[1]["type"] == "scheduler.reservation_queued"
    await env.release(uuid.UUID(whole["data"]["allocation_id"]))
    placed = await env.reply(cmd["allocation_id"], ("scheduler.slots_reserved",))
    assert placed["data"]["node_id"] == str(node) and placed["correlation_id"] == queued["correlation_id"]
    assert placed["data"]["idempotency_key"] == cmd["idempotency_key"]
    repeat, _ = await send(env.js, "scheduler.reserve_slots", cmd)
    [answer] = await env.events.wait_for(caused_by(repeat))
    assert answer[1]["type"] == "scheduler.slots_reserved" and answer[1]["data"]["slots"] == placed["data"]["slots"]
    assert len(await env.held(cmd["allocation_id"])) == 2


async def test_a_cancelled_pending_request_fails_with_code_cancelled_and_is_never_placed(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 16)
    await env.onboard()
    whole = await env.reserve(tenant, "vm.8gpu")
    waiting = await env.reserve(tenant, "vm.4gpu")
    alloc = uuid.UUID(waiting["data"]["allocation_id"])
    await send(env.js, "scheduler.cancel_request", {"allocation_id": alloc, "tenant_id": tenant,
                                                    "requested_by": uuid.uuid4()})
    failed = await env.reply(alloc, ("scheduler.slot_reservation_failed",))
    assert failed["data"]["code"] == "cancelled"
    await env.release(uuid.UUID(whole["data"]["allocation_id"]))
    again, _ = await send(env.js, "scheduler.cancel_request", {"allocation_id": alloc, "tenant_id": tenant,
                                                               "requested_by": uuid.uuid4()})
    [rejected] = await env.events.wait_for(caused_by(again))
    assert rejected[1]["type"] == "scheduler.admin_command_rejected" and "no pending request" in rejected[1]["data"]["reason"]
    assert await env.held(alloc) == []


async def test_a_flooding_tenant_hits_its_queue_bound_and_another_tenant_is_placed_before_its_backlog(
        run_service, nc, watch):
    env = await start(run_service, nc, watch, scheduler=SchedulerSettings(queue_per_tenant=3, stats_s=5, burn_in=False))
    flood, other, holder = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for t in (flood, other, holder):
        await env.grant(t, 64)
    await env.onboard()
    await env.onboard()
    whole = await env.reserve(holder, "vm.8gpu")
    assert (await env.reserve(flood, "vm.8gpu"))["type"] == "scheduler.slots_reserved"   # the flood already runs 8
    flood_replies = [await env.reserve(flood, "vm.4gpu") for _ in range(5)]
    kinds = [r["type"].split(".")[1] for r in flood_replies]
    assert kinds == ["reservation_queued"] * 3 + ["slot_reservation_failed"] * 2
    assert {r["data"]["code"] for r in flood_replies[3:]} == {"queue-full"}
    assert "3 pending request(s)" in flood_replies[3]["data"]["reason"]
    late = await env.reserve(other, "vm.4gpu")
    assert late["type"] == "scheduler.reservation_queued"
    await env.release(uuid.UUID(whole["data"]["allocation_id"]))     # room for two 4-GPU slices
    await env.reply(late["data"]["allocation_id"], ("scheduler.slots_reserved",))
    await env.reply(flood_replies[0]["data"]["allocation_id"], ("scheduler.slots_reserved",))
    for r in flood_replies[1:3]:       # the flood's backlog still waits: the other tenant did not
        assert await env.held(uuid.UUID(r["data"]["allocation_id"])) == []


async def test_a_standby_takes_over_when_the_leaders_session_dies_and_reloads_the_queue(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    standby = await run_service("scheduler", lambda s: build(s, SchedulerSettings(stats_s=5, burn_in=False)), instance="1")
    tenant = uuid.uuid4()
    await env.grant(tenant, 16)
    await env.onboard()
    assert not standby.leadership.leading.is_set()
    whole = await env.reserve(tenant, "vm.8gpu")
    waiting = await env.reserve(tenant, "vm.2gpu")
    assert waiting["type"] == "scheduler.reservation_queued"
    env.rt.leadership.lease.terminate_for_test()          # the leader's database session dies
    await asyncio.wait_for(standby.leadership.leading.wait(), 30)
    await eventually(lambda: not env.rt.leadership.leading.is_set(), timeout=30, interval=0.02)   # the old one noticed
    await env.release(uuid.UUID(whole["data"]["allocation_id"]))
    placed = await env.reply(waiting["data"]["allocation_id"], ("scheduler.slots_reserved",), timeout=30)
    assert len(placed["data"]["slots"]) == 2 and standby.scheduler.sched.inv.holding(
        uuid.UUID(waiting["data"]["allocation_id"])) is not None


async def test_a_waiting_8gpu_request_reserves_a_node_after_aging_so_backfill_cannot_starve_it(run_service, nc, watch):
    env = await start(run_service, nc, watch, scheduler=SchedulerSettings(aging_s=0.5, stats_s=5, burn_in=False))
    tenant = uuid.uuid4()
    await env.grant(tenant, 64)
    node = await env.onboard()
    small = await env.reserve(tenant, "vm.1gpu")
    big = await env.reserve(tenant, "vm.8gpu")
    assert big["type"] == "scheduler.reservation_queued"
    big_id = uuid.UUID(big["data"]["allocation_id"])
    await eventually(lambda: env.rt.scheduler.sched.reservations.get(big_id) == node, timeout=20, interval=0.02)
    backfill = await env.reserve(tenant, "vm.1gpu")       # 7 GPUs are free, but the node is reserved
    assert backfill["type"] == "scheduler.reservation_queued"
    await env.release(uuid.UUID(small["data"]["allocation_id"]))
    placed = await env.reply(big_id, ("scheduler.slots_reserved",))
    assert placed["data"]["slots"] == list(range(8)) and await env.held(uuid.UUID(backfill["data"]["allocation_id"])) == []
