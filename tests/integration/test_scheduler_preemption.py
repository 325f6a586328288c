"""Preemption and observability through the running service: a higher-priority request that cannot
fit preempts a lower-priority allocation (notice first, ``allocation.preempt`` only after the grace
period, the freed node goes to the preemptor), never below the victim tenant's guaranteed quota; and
the scheduler's metrics and periodic ``scheduling_stats`` event."""
from __future__ import annotations

import uuid
from datetime import datetime

import aiohttp

from tests.support.scheduler import start


async def test_a_higher_priority_request_preempts_after_a_notice_and_its_grace_then_gets_the_slots(
        run_service, nc, watch):
    env = await start(run_service, nc, watch)
    preempt = await watch("allocation.cmd.preempt")
    low, high = uuid.uuid4(), uuid.uuid4()
    await env.grant(low, 16)
    await env.grant(high, 8)
    node = await env.onboard()
    victim = await env.reserve(low, "vm.8gpu", priority=0)
    victim_id = victim["data"]["allocation_id"]
    wanted = await env.reserve(high, "vm.4gpu", priority=10)
    assert wanted["type"] == "scheduler.reservation_queued" and "preempting 1" in wanted["data"]["reason"]
    [notice] = await env.events.wait_for(lambda i: i[1]["type"] == "scheduler.preemption_notice")
    n = notice[1]["data"]
    assert (n["allocation_id"], n["node_id"], n["preempted_for"]) == (victim_id, str(node), wanted["data"]["allocation_id"])
    [cmd] = await preempt.wait_for(lambda i: i[1]["data"]["allocation_id"] == victim_id)
    sent = datetime.fromisoformat(cmd[1]["occurred_at"])
    assert sent >= datetime.fromisoformat(n["grace_deadline"]) and cmd[1]["data"]["preempted_for"] == n["preempted_for"]
    assert "priority 10" in cmd[1]["data"]["reason"]
    other = await env.reserve(low, "vm.2gpu", priority=0)     # backfill may not take the nominated node
    assert other["type"] == "scheduler.reservation_queued"
    await env.release(uuid.UUID(victim_id))                 # what the release saga does
    placed = await env.reply(wanted["data"]["allocation_id"], ("scheduler.slots_reserved",))
    assert placed["data"]["node_id"] == str(node) and len(placed["data"]["slots"]) == 4


async def test_preemption_never_takes_an_allocation_inside_its_tenants_guaranteed_quota(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    low, high = uuid.uuid4(), uuid.uuid4()
    await env.grant(low, 8, guaranteed=8)
    await env.grant(high, 8)
    await env.onboard()
    victim = await env.reserve(low, "vm.8gpu", priority=0)
    wanted = await env.reserve(high, "vm.4gpu", priority=10)
    assert wanted["type"] == "scheduler.reservation_queued" and wanted["data"]["reason"].startswith("no capacity")
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM preemptions WHERE victim=$1",
                                   uuid.UUID(victim["data"]["allocation_id"])) == 0


async def test_metrics_and_the_stats_event_report_pending_utilisation_and_fragmentation(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 16)
    await env.onboard()
    await env.reserve(tenant, "vm.2gpu")
    await env.reserve(tenant, "vm.8gpu")              # waits: 6 free GPUs on one node
    [stats] = await env.events.wait_for(lambda i: i[1]["type"] == "scheduler.scheduling_stats"
                                        and i[1]["data"]["pending"].get(str(tenant)) == 1)
    key = f"{env.pool}/H100"
    assert stats[1]["data"]["utilisation"][key] == [2, 8] and stats[1]["data"]["fragmentation"][key] == 1.0
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{env.rt.port}/metrics") as resp:
        text = await resp.text()
    assert f'tessera_scheduler_pending{{tenant="{tenant}"}} 1.0' in text
    assert f'tessera_scheduler_decision_seconds_count{{outcome="placed",tenant="{tenant}"}} 1.0' in text
    assert f'tessera_scheduler_pool_utilisation_ratio{{gpu_model="H100",pool="{env.pool}"}} 0.25' in text
