"""The health monitor through the running scheduler: heartbeats (played on the bus as a node-agent sends them)
judged into node health; a fatal XID cordons the node and interrupts every allocation on it; a node that stops
answering is cordoned too unless the pool's breaker is open; a node that answers again while it holds an
allocation placed elsewhere is told to fence it, and is healthy once it has."""
from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from itertools import count

import pytest

from services.scheduler.settings import SchedulerSettings
from shared.contract import load_catalog
from shared.periodic import periodic
from tests.support.bus import make_envelope
from tests.support.bus import send_command as send
from tests.support.scheduler import start

FAST = SchedulerSettings(preemption_grace_s=0.5, stats_s=0.5, burn_in=False, heartbeat_timeout_s=0.6,
                         health_period_s=0.1, fence_retry_s=0.3)


class Agents:
    """Node-agents played on the bus: each node's heartbeat, every 0.1 s while it is 'up'."""

    def __init__(self, nc):
        self.nc, self.up, self.alerts, self.instances, self.tasks = nc, {}, {}, {}, []

    def start(self, node: uuid.UUID) -> None:
        self.up[node], self.alerts[node], self.instances[node] = True, [], []
        subject = load_catalog().message("node_agent.heartbeat").render_subject(node_id=str(node))
        started, seq = datetime.now(UTC).isoformat(), count()

        async def beat() -> None:
            if self.up[node]:
                env = make_envelope("node_agent.heartbeat", {
                    "node_id": str(node), "seq": next(seq), "sent_at": datetime.now(UTC).isoformat(),
                    "started_at": started, "alerts": self.alerts[node],
                    "instances": [str(i) for i in self.instances[node]], "gpus": []}, correlation_id=str(node))
                await self.nc.publish(subject, env.model_dump_json().encode())
        self.tasks.append(asyncio.create_task(periodic(0.1, beat, at_once=True)()))   # the agent's period

    def stop(self) -> None:
        for t in self.tasks:
            t.cancel()


@pytest.fixture
async def agents(nc):
    a = Agents(nc)
    yield a
    a.stop()


def _xid(code: int, gpu: int = 3) -> dict:
    return {"source": "sim", "target": f"gpu:{gpu}", "condition": f"xid:{code}",
            "since": datetime.now(UTC).isoformat(), "message": f"Xid {code} on GPU {gpu}",
            "tenant_message": "a GPU of this allocation failed"}


async def _health(env, node, pred, timeout=20.0) -> dict:
    hits = await env.events.wait_for(lambda i: i[1]["type"] == "scheduler.node_health_changed"
                                     and i[1]["data"]["node_id"] == str(node) and pred(i[1]["data"]), timeout=timeout)
    return [h for h in hits if h[1]["type"] == "scheduler.node_health_changed"
            and h[1]["data"]["node_id"] == str(node) and pred(h[1]["data"])][-1][1]["data"]


async def test_a_fatal_xid_cordons_the_node_and_interrupts_every_allocation_on_it(run_service, nc, watch, agents):
    env = await start(run_service, nc, watch, scheduler=FAST)
    interrupts = await watch("allocation.cmd.interrupt")
    tenants = [uuid.uuid4() for _ in range(3)]
    for t in tenants:
        await env.grant(t, 8)
    nodes = {await env.onboard(), await env.onboard()}
    placed = [await env.reserve(t, "vm.2gpu", fail_fast=True) for t in tenants]
    node = uuid.UUID(placed[0]["data"]["node_id"])              # the node that holds them (the pool packs)
    [spare] = nodes - {node}
    on_node = {p["data"]["allocation_id"] for p in placed if p["data"]["node_id"] == str(node)}
    agents.start(node)
    agents.start(spare)
    await _health(env, node, lambda d: d["state"] == "healthy")
    agents.alerts[node] = [_xid(79)]
    doc = await _health(env, node, lambda d: d["cordoned_by"] == "xid:79")
    assert doc["alerts"][0]["classifications"] == ["drain", "fence", "replace"]
    assert (await env.node_event(node, lambda d: d["cordoned"]))["cordoned"]
    hits = await interrupts.wait_for(lambda i: len([x for x in interrupts.items
                                                    if x[1]["data"]["node_id"] == str(node)]) == len(on_node))
    sent = [h[1]["data"] for h in hits if h[1]["data"]["node_id"] == str(node)]
    assert {s["allocation_id"] for s in sent} == on_node and all(s["category"] == "gpu_fault" for s in sent)
    assert "drained" in doc["event"]
    late = await env.reserve(tenants[0], "vm.2gpu", fail_fast=True)
    assert late["data"].get("node_id") != str(node)          # nothing new lands on the cordoned node


async def test_an_application_xid_alerts_without_cordoning(run_service, nc, watch, agents):
    env = await start(run_service, nc, watch, scheduler=FAST)
    node = await env.onboard()
    agents.start(node)
    agents.alerts[node] = [_xid(13)]
    doc = await _health(env, node, lambda d: d["alerts"])
    assert doc["alerts"][0]["classifications"] == [] and doc["cordoned_by"] is None
    async with env.rt.pool.acquire() as conn:
        assert not await conn.fetchval("SELECT cordoned FROM nodes WHERE id=$1", node)


async def test_a_silent_node_is_suspect_then_unreachable_and_the_breaker_holds_the_second(run_service, nc, watch,
                                                                                         agents):
    env = await start(run_service, nc, watch, scheduler=FAST)
    first, second = await env.onboard(), await env.onboard()
    for n in (first, second):
        agents.start(n)
        await _health(env, n, lambda d: d["state"] == "healthy")
    agents.up[first] = False
    await _health(env, first, lambda d: d["state"] == "suspect")
    lost = await _health(env, first, lambda d: d["state"] == "unreachable")
    assert lost["cordoned_by"] == "heartbeat_lost" and lost["alerts"][-1]["condition"] == "heartbeat_lost"
    agents.up[second] = False        # half of this two-node pool is cordoned already: the breaker opens
    held = await _health(env, second, lambda d: d["state"] == "unreachable")
    assert held["cordoned_by"] is None and "breaker is open" in held["event"] and held["breaker_open"]
    breaker = await env.events.wait_for(lambda i: i[1]["type"] == "scheduler.breaker_changed"
                                        and i[1]["data"]["pool"] == env.pool)
    assert [b for b in breaker if b[1]["type"] == "scheduler.breaker_changed"][-1][1]["data"]["open"]
    await send(env.js, "scheduler.close_breaker", {"pool": env.pool})
    await env.events.wait_for(lambda i: i[1]["type"] == "scheduler.breaker_changed" and not i[1]["data"]["open"]
                              and i[1]["data"]["pool"] == env.pool)
    agents.up[first] = True          # it answers again, holding nothing placed elsewhere: healthy, uncordoned
    back = await _health(env, first, lambda d: d["state"] == "healthy" and d["version"] > lost["version"])
    assert back["cordoned_by"] is None
    await env.node_event(first, lambda d: not d["cordoned"])


async def test_a_node_holding_an_allocation_placed_elsewhere_is_told_to_fence_it(run_service, nc, watch, agents):
    env = await start(run_service, nc, watch, scheduler=FAST)
    node = await env.onboard()
    fences = await watch(f"node_agent.cmd.fence_instances.{node}")
    moved = uuid.uuid4()                      # placed on no node of this scheduler
    agents.start(node)
    agents.instances[node] = [moved]
    doc = await _health(env, node, lambda d: d["state"] == "reconciling")
    assert "fencing 1 instance" in doc["event"]
    hits = await fences.wait_for(lambda i: i[1]["data"]["allocation_ids"] == [str(moved)])
    assert hits[-1][0] == f"node_agent.cmd.fence_instances.{node}"
    agents.instances[node] = []               # the agent fenced it
    await _health(env, node, lambda d: d["state"] == "healthy")


async def test_a_drain_with_a_deadline_cordons_now_and_interrupts_at_the_deadline(run_service, nc, watch):
    env = await start(run_service, nc, watch, scheduler=FAST)
    interrupts = await watch("allocation.cmd.interrupt")
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    node = await env.onboard()
    alloc = (await env.reserve(tenant, "vm.2gpu", fail_fast=True))["data"]["allocation_id"]
    deadline = datetime.now(UTC).timestamp() + 1.5
    await send(env.js, "scheduler.drain_node", {"node_id": node, "mode": "deadline",
                                                "deadline": datetime.fromtimestamp(deadline, UTC).isoformat()})
    doc = await _health(env, node, lambda d: d["draining"])
    assert doc["drain_deadline"] is not None
    await env.node_event(node, lambda d: d["cordoned"])
    hits = await interrupts.wait_for(lambda i: i[1]["data"]["allocation_id"] == alloc)
    assert hits[-1][1]["data"]["category"] == "maintenance"
    assert datetime.now(UTC).timestamp() >= deadline


async def test_an_uncordon_ends_the_nodes_drain_in_its_health(run_service, nc, watch):
    env = await start(run_service, nc, watch, scheduler=FAST)
    node = await env.onboard()
    far = datetime.fromtimestamp(datetime.now(UTC).timestamp() + 3600, UTC).isoformat()
    await send(env.js, "scheduler.drain_node", {"node_id": node, "mode": "deadline", "deadline": far})
    await _health(env, node, lambda d: d["draining"])
    await send(env.js, "scheduler.update_node", {"node_id": node, "cordoned": False, "requested_by": str(uuid.uuid4())})
    doc = await _health(env, node, lambda d: not d["draining"])
    assert doc["drain_deadline"] is None and "the drain ended" in doc["event"]
