"""Burn-in before hand-off and quarantined slots, through the running scheduler: an approved node is burnt in
by its node-agent (played here on the bus) before anything is placed on it; a failed check keeps it out of
service, named; a provider admin re-runs it; a slot whose wipe failed at release is quarantined, never placed,
and returns only after a successful re-wipe."""
from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from services.node_agent.adapters.discovery.sim import sim_topology
from services.scheduler.settings import SchedulerSettings
from tests.support.bus import publish_from_node
from tests.support.bus import send_command as send
from tests.support.scheduler import start

BURN_IN = SchedulerSettings(preemption_grace_s=0.5, stats_s=0.5, burn_in=True)


async def _approved(env, watch, kind: str = "pcie-l40s-4") -> tuple[uuid.UUID, dict]:
    """A node declared, discovered and approved: returns it and the burn-in command its agent received."""
    commands = await watch("node_agent.cmd.burn_in.>")
    node = uuid.uuid4()
    topo = sim_topology(f"n-{node.hex}", kind)
    await env.register(node, model=topo.gpus[0].model, gpus=len(topo.gpus))
    await env.report(node, topo.to_dict())
    doc = await env.node_event(node, lambda d: d["status"] == "pending_approval")
    await env.approve(node, doc["proposal"])
    hits = await commands.wait_for(lambda i: i[0] == f"node_agent.cmd.burn_in.{node}")
    return node, hits[-1][1]["data"]


def _result(node: uuid.UUID, run_id: str, failed: str | None = None) -> dict:
    checks = [{"name": n, "ok": n != failed, "detail": "GPU 2: retired pages pending" if n == failed else "ok"}
              for n in ("gpus_present", "retired_pages", "temperature")]
    return {"node_id": str(node), "run_id": run_id, "passed": failed is None, "checks": checks,
            "at": datetime.now(UTC).isoformat()}


async def test_an_approved_node_is_burnt_in_before_anything_is_placed_on_it(run_service, nc, watch):
    env = await start(run_service, nc, watch, scheduler=BURN_IN)
    tenant = uuid.uuid4()
    await env.grant(tenant, 4, model="L40S")
    node, cmd = await _approved(env, watch)
    doc = await env.node_event(node, lambda d: d["status"] == "burn_in")
    assert doc["free_slots"] == 0 and doc["burn_in"]["state"] == "running" and doc["burn_in"]["run_id"] == cmd["run_id"]
    early = await env.reserve(tenant, "vm.1gpu", fail_fast=True)
    assert early["data"]["code"] == "no-capacity"
    await publish_from_node(nc, "node_agent.burn_in_finished", node, _result(node, str(uuid.uuid4())))   # another run: stale
    await publish_from_node(nc, "node_agent.burn_in_finished", node, _result(node, cmd["run_id"]))
    passed = await env.node_event(node, lambda d: d["status"] == "schedulable")
    assert passed["free_slots"] == 4 and passed["burn_in"]["state"] == "passed"
    late = await env.reserve(tenant, "vm.1gpu", fail_fast=True)
    assert late["type"] == "scheduler.slots_reserved" and late["data"]["node_id"] == str(node)


async def test_a_failed_check_keeps_the_node_out_of_service_named_until_a_rerun_passes(run_service, nc, watch):
    env = await start(run_service, nc, watch, scheduler=BURN_IN)
    node, cmd = await _approved(env, watch)
    await publish_from_node(nc, "node_agent.burn_in_finished", node, _result(node, cmd["run_id"], failed="retired_pages"))
    failed = await env.node_event(node, lambda d: d["status"] == "burn_in_failed")
    assert failed["review"] == ["burn-in check retired_pages failed: GPU 2: retired pages pending"]
    assert failed["free_slots"] == 0 and failed["burn_in"]["state"] == "failed"
    commands = await watch("node_agent.cmd.burn_in.>")
    await send(env.js, "scheduler.run_burn_in", {"node_id": node, "requested_by": uuid.uuid4()})
    hits = await commands.wait_for(lambda i: i[0] == f"node_agent.cmd.burn_in.{node}")
    rerun = hits[-1][1]["data"]
    assert rerun["run_id"] != cmd["run_id"]
    await env.node_event(node, lambda d: d["status"] == "burn_in" and d["burn_in"]["run_id"] == rerun["run_id"])
    await publish_from_node(nc, "node_agent.burn_in_finished", node, _result(node, rerun["run_id"]))
    assert (await env.node_event(node, lambda d: d["status"] == "schedulable"))["free_slots"] == 4


async def test_a_rerun_is_refused_while_allocations_run_on_the_node(run_service, nc, watch):
    env = await start(run_service, nc, watch, scheduler=BURN_IN)
    tenant = uuid.uuid4()
    await env.grant(tenant, 4, model="L40S")
    node, cmd = await _approved(env, watch)
    await publish_from_node(nc, "node_agent.burn_in_finished", node, _result(node, cmd["run_id"]))
    await env.node_event(node, lambda d: d["status"] == "schedulable")
    assert (await env.reserve(tenant, "vm.1gpu", fail_fast=True))["type"] == "scheduler.slots_reserved"
    sent, _ = await send(env.js, "scheduler.run_burn_in", {"node_id": node, "requested_by": uuid.uuid4()})
    hits = await env.events.wait_for(lambda i: i[1]["type"] == "scheduler.admin_command_rejected"
                                     and i[1].get("causation_id") == str(sent.id))
    assert "drain it before a burn-in" in hits[-1][1]["data"]["reason"]


async def test_a_slot_whose_wipe_failed_is_quarantined_never_placed_and_returns_after_a_rewipe(run_service, nc, watch):
    env = await start(run_service, nc, watch)   # burn-in off: this test is about the slots
    tenant = uuid.uuid4()
    await env.grant(tenant, 8, model="L40S")
    node = await env.onboard("pcie-l40s-4")
    first = await env.reserve(tenant, "vm.1gpu", fail_fast=True)
    alloc, [slot] = uuid.UUID(first["data"]["allocation_id"]), first["data"]["slots"]
    assert first["data"]["slot_details"][0]["wipe_policy"] == "nvme-secure-erase"
    states = await watch("scheduler.evt.slot_state_changed")
    saga = uuid.uuid4()
    await send(env.js, "scheduler.release_slots", {
        "saga_id": saga, "step": "release_slots", "idempotency_key": f"{saga}:release_slots", "allocation_id": alloc,
        "tenant_id": tenant, "quarantine": [{"slot": slot, "reason": "blkdiscard: Operation not permitted"}]})
    doc = await env.node_event(node, lambda d: d.get("quarantined"), timeout=5)
    assert [q["slot"] for q in doc["quarantined"]] == [slot] and doc["quarantined"][0]["reason"].startswith("blkdiscard")
    hit = (await states.wait_for(lambda i: i[1]["data"]["node_id"] == str(node)))[-1][1]["data"]
    assert (hit["slot"], hit["state"], hit["allocation_id"]) == (slot, "quarantined", str(alloc))
    taken = [(await env.reserve(tenant, "vm.1gpu", fail_fast=True))["data"] for _ in range(4)]
    assert [t.get("code") for t in taken].count("no-capacity") == 1   # three slots left, never the quarantined one
    assert slot not in {s for t in taken for s in t.get("slots", [])}
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT node_free_slots($1)", node) == 0
    await publish_from_node(nc, "node_agent.slot_rewiped", node, {
        "request_id": str(uuid.uuid4()), "node_id": str(node), "slot": slot, "ok": True, "requested_by": str(uuid.uuid4()),
        "evidence": {"slot": slot, "ok": True, "policy": "nvme-secure-erase", "gpu_reset": "no-driver", "devices": [],
                     "started_at": datetime.now(UTC).isoformat(), "finished_at": datetime.now(UTC).isoformat(),
                     "duration_s": 0.1, "agent_version": "test"}})
    back = await env.node_event(node, lambda d: not d["quarantined"] and d["version"] > doc["version"])
    assert back["capacity"]["free_slots"] == 1
    again = await env.reserve(tenant, "vm.1gpu", fail_fast=True)
    assert again["type"] == "scheduler.slots_reserved" and again["data"]["slots"] == [slot]
    async with env.rt.pool.acquire() as conn:
        row = await conn.fetchrow("SELECT wipe_policy, detail FROM slots WHERE node_id=$1 AND idx=$2", node, slot)
    assert row["wipe_policy"] == json.loads(row["detail"])["wipe_policy"] == "nvme-secure-erase"
