"""Scheduler against real NATS JetStream and PostgreSQL: NUMA-aligned reservations and their device
details, one effect per idempotency key, release and tombstones, dead-lettering and unknown shapes.

The inventory is shared by the whole test session, so every test works in a pool of its own (``Env``):
its nodes, quotas and requests name that pool, and nothing another test left behind can take a request.
The world each test starts (``Env``, ``start``) is in tests/support/scheduler.py."""
from __future__ import annotations

import asyncio
import uuid

from services.node_agent.adapters.discovery.sim import sim_topology
from services.scheduler.bootstrap import build
from tests.support.bus import caused_by, wait_handled
from tests.support.bus import send_command as send
from tests.support.scheduler import start

# ---- reservations

async def test_a_4gpu_slice_lands_on_one_numa_node_and_reports_its_devices(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    node = await env.onboard()
    one = await env.reserve(tenant, "vm.1gpu")
    four = await env.reserve(tenant, "vm.4gpu")
    assert one["data"]["slots"] == [0]
    details = four["data"]["slot_details"]
    assert four["data"]["slots"] == [4, 5, 6, 7] and {d["numa"] for d in details} == {1}
    topo = sim_topology(f"n-{node.hex}")
    assert [d["gpu_pci"] for d in details] == [g.pci for g in topo.gpus[4:]]
    assert [d["nvme_pci"] for d in details] == [n.pci for n in topo.nvmes[4:]]
    assert [d["ib_vf_pci"] for d in details] == [v.pci for v in topo.ib_vfs[4:]]


async def test_reserve_delivered_twice_or_retried_under_its_key_reserves_once(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    node = await env.onboard()
    cmd = env.reserve_cmd(tenant, "vm.2gpu")
    first, _ = await send(env.js, "scheduler.reserve_slots", cmd)
    _, seq = await send(env.js, "scheduler.reserve_slots", {}, env=first, msg_id=f"again-{first.id}")
    await env.reply(cmd["allocation_id"])
    await wait_handled(env.js, "scheduler", "scheduler.reserve_slots", seq)
    retry, _ = await send(env.js, "scheduler.reserve_slots", cmd)
    [again] = await env.events.wait_for(caused_by(retry))
    assert again[1]["type"] == "scheduler.slots_reserved" and again[1]["data"]["slots"] == [0, 1]
    assert await env.held(cmd["allocation_id"]) == [(node, 0), (node, 1)]
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1", tenant) == 2
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE type='scheduler.slots_reserved' AND "
                                   "convert_from(body, 'UTF8')::jsonb->'data'->>'allocation_id' = $1",
                                   str(cmd["allocation_id"])) == 2   # one per reserve handled, not per delivery


async def test_release_frees_the_slots_refunds_the_quota_and_is_idempotent(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    await env.onboard()
    placed = await env.reserve(tenant, "vm.4gpu")
    alloc = uuid.UUID(placed["data"]["allocation_id"])
    freed = await env.release(alloc)
    assert freed["data"]["slots_freed"] == 4 and await env.held(alloc) == []
    again = await env.release(alloc)
    assert again["data"]["slots_freed"] == 0
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1", tenant) == 0


async def test_compensation_before_the_reservation_leaves_a_tombstone_so_the_late_reserve_fails(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    await env.onboard()
    cmd = env.reserve_cmd(tenant)
    await env.release(cmd["allocation_id"], compensates=cmd["idempotency_key"])
    await send(env.js, "scheduler.reserve_slots", cmd)
    late = await env.reply(cmd["allocation_id"])
    assert late["type"] == "scheduler.slot_reservation_failed" and "compensated" in late["data"]["reason"]
    assert await env.held(cmd["allocation_id"]) == []


async def test_malformed_reserve_is_dead_lettered_and_an_unknown_shape_fails_with_its_code(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    dead = await watch("deadletter.scheduler.>")
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    await env.onboard()
    malformed = env.reserve_cmd(tenant)
    del malformed["gpu_count"]
    bad, _ = await send(env.js, "scheduler.reserve_slots", malformed)
    [hit] = await dead.wait_for(lambda i: i[1]["id"] == str(bad.id))
    assert hit[2]["Tessera-DLQ-Reason"] == "invalid" and "gpu_count" in hit[2]["Tessera-DLQ-Error"]
    unknown = await env.reserve(tenant, "vm.3gpu")
    assert unknown["data"]["code"] == "unknown-shape" and "vm.3gpu" in unknown["data"]["reason"]
    good = await env.reserve(tenant, "vm.1gpu")
    assert good["type"] == "scheduler.slots_reserved"
    assert await env.held(malformed["allocation_id"]) == []


async def test_mig_instances_share_one_gpu_up_to_the_profile_count_and_return_it_when_released(
        run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 16)
    node = await env.onboard()
    replies = [await env.reserve(tenant, "mig.1g.10gb") for _ in range(8)]
    assert {r["type"] for r in replies} == {"scheduler.slots_reserved"}
    gpus = [r["data"]["slots"][0] for r in replies]
    assert len(set(gpus[:7])) == 1 and gpus[7] != gpus[0]       # 1g.10gb: 7 instances per 80 GB GPU
    whole = await env.reserve(tenant, "vm.8gpu", fail_fast=True)
    assert whole["data"]["code"] == "no-capacity"             # a partitioned GPU is not a whole one
    await env.release(uuid.UUID(replies[0]["data"]["allocation_id"]))
    async with env.rt.pool.acquire() as conn:
        row = await conn.fetchrow("SELECT mig_profile, mig_used, allocation_id FROM slots WHERE node_id=$1 AND idx=$2",
                                  node, gpus[0])
        assert (row["mig_profile"], row["mig_used"], row["allocation_id"]) == ("1g.10gb", 6, None)
        assert await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1", tenant) == 7


def test_bad_scheduler_settings_are_refused_naming_the_variable(monkeypatch):
    import pytest

    from services.scheduler.settings import SchedulerSettings
    for name, value in (("TESSERA_SCHEDULER_QUEUE_PER_TENANT", "0"), ("TESSERA_SCHEDULER_PREEMPTION_GRACE_S", "soon"),
                        ("TESSERA_SCHEDULER_STATS_S", "-1"), ("TESSERA_SCHEDULER_LEADER_ELECTION", "maybe")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=name):
            SchedulerSettings.from_env()
        monkeypatch.delenv(name)
    assert SchedulerSettings.from_env().queue_per_tenant == 100


async def test_a_new_leader_announces_the_seeded_shapes_and_pools_so_read_models_know_them(run_service, nc, watch):
    events = await watch("scheduler.evt.>")          # watching before the scheduler starts
    from services.scheduler.settings import SchedulerSettings
    rt = await run_service("scheduler", lambda s: build(s, SchedulerSettings()))
    await asyncio.wait_for(rt.leadership.leading.wait(), 30)
    shapes = await events.wait_for(lambda i: i[1]["type"] == "scheduler.shape_changed"
                                   and i[1]["data"]["name"] == "mig.1g.10gb")
    mig = shapes[-1][1]["data"]
    assert (mig["kind"], mig["gpu_count"], mig["mig_profile"]) == ("mig", 1, "1g.10gb") and mig["version"] >= 1
    pools = await events.wait_for(lambda i: i[1]["type"] == "scheduler.pool_changed" and i[1]["data"]["name"] == "shared")
    assert pools[-1][1]["data"]["policy"] == "pack"
    announced = {i[1]["data"]["name"] for i in events.items if i[1]["type"] == "scheduler.shape_changed"}
    assert {"vm.1gpu", "vm.2gpu", "vm.4gpu", "vm.8gpu", "bm.8gpu", "mig.1g.10gb"} <= announced
