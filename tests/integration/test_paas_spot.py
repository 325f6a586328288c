"""A pool's spot offering, live, against real NATS and PostgreSQL: the scheduler's figures and notices and the
allocations are played on the bus; the spot market is the NVCF-shaped recording driver, whose calls are asserted."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from services.paas.adapters.spot.nvcf import RecordingNvcfProvider
from services.paas.bootstrap import build
from services.paas.settings import PaasSettings
from tests.support.bus import publish_event, send_command
from tests.support.paas import released
from tests.support.polling import eventually


@pytest.fixture
async def spot(run_service, nc, watch, tmp_path):
    settings = PaasSettings(state_dir=str(tmp_path), reconcile_s=0.05, spot_usage_s=0.1)
    await run_service("paas", partial(build, paas=settings, runtimes={},
                                      spot_provider_of=lambda p: RecordingNvcfProvider(tmp_path / f"{p}.jsonl")))
    pool = f"p-{uuid.uuid4().hex[:8]}"   # the schema and the streams outlive a test: each has its own pool
    record = tmp_path / f"{pool}.jsonl"
    return Spot(nc.jetstream(), await watch("paas.evt.spot_offering_changed"), await watch("allocation.cmd.>"),
                record, pool)


@dataclass
class Spot:
    js: object
    events: object
    allocs: object
    record: object
    pool: str


def offering_cmd(pool, tenant, **over):
    return {"pool": pool, "enabled": True, "tenant_id": str(tenant), "user_id": str(uuid.uuid4()), "shape": "vm.8gpu",
            "gpu_count": 8, "gpu_model": "H100", "max_nodes": 4, "headroom_gpus": 0, "notice_s": 1,
            "cluster_name": "tessera-spot", "requested_by": "ops", **over}


async def stats(s, used: int, total: int, reserve: int) -> None:
    await publish_event(s.js, "scheduler.scheduling_stats", {
        "at": datetime.now(UTC).isoformat(), "pending": {}, "utilisation": {f"{s.pool}/H100": [used, total]},
        "fragmentation": {}, "spot_reserve": {s.pool: reserve}})


def calls(record, name):
    if not record.exists():
        return []
    return [c for c in map(json.loads, record.read_text().splitlines()) if c["call"] == name]


async def offering(s, until, what):
    def newest():
        docs = [e[1]["data"] for e in s.events.items if e[1]["data"]["pool"] == s.pool]
        return max(docs, key=lambda d: d["version"]) if docs else None
    return await eventually(newest, timeout=20, until=lambda d: d is not None and until(d), what=what)


def mine(s, type_):
    """This test's allocation commands of ``type_`` (the stream holds earlier tests' too)."""
    ours = {r[1]["data"]["allocation_id"] for r in s.allocs.items
            if r[1]["type"] == "allocation.request" and r[1]["data"]["pool"] == s.pool}
    return [r[1]["data"] for r in s.allocs.items if r[1]["type"] == type_ and r[1]["data"]["allocation_id"] in ours]


def live(doc, state):
    return [n for n in doc["nodes"] if n["state"] == state]


async def requests(s, n):
    got = await eventually(lambda: mine(s, "allocation.request"),
                           timeout=20, until=lambda r: len(r) >= n, what=f"{n} spot allocation(s) requested")
    return got


async def activate(js, req, node):
    await publish_event(js, "allocation.activated", {
        "allocation_id": req["allocation_id"], "tenant_id": req["tenant_id"], "state": "ACTIVE",
        "at": datetime.now(UTC).isoformat(), "saga_id": str(uuid.uuid4()), "step": "activate",
        "idempotency_key": "x", "node_id": str(node)}, tenant_id=req["tenant_id"])


async def grown(s, tenant, nodes=2):
    """Enable the offering on an idle pool of ``nodes`` × 8 GPUs: it asks for that many spot nodes; each is
    offered to the market once ACTIVE."""
    await send_command(s.js, "paas.set_spot_offering", offering_cmd(s.pool, tenant))
    await offering(s, lambda d: d["enabled"], "the offering enabled")
    await stats(s, 0, 8 * nodes, 0)
    reqs = await requests(s, nodes)
    for i, r in enumerate(reqs):
        await activate(s.js, r, uuid.UUID(int=i + 1))
    doc = await offering(s, lambda d: len(live(d, "offered")) == nodes, "every spot node offered")
    await eventually(lambda: calls(s.record, "offer_nodes"), timeout=20,
                     until=lambda c: sum(len(x["commands"]) for x in c) == 2 * nodes, what="the nodes offered")
    return reqs, doc


async def test_it_grows_into_idle_gpus_and_gives_a_node_back_with_notice_when_tenants_claim_it(spot):
    s = spot
    tenant = uuid.uuid4()
    reqs, doc = await grown(s, tenant)
    assert all(r["spot"] and r["pool"] == s.pool and r["shape"] == "vm.8gpu" and r["tenant_id"] == str(tenant)
               for r in reqs)
    assert doc["offered_gpus"] == 16 and doc["driver"] == "recording"
    await offering(s, lambda d: d["market_usage"] == {"H100": {"offered": 16, "in_use": 0}}, "the market's report")
    [reg] = calls(s.record, "register_cluster")
    assert "clusterID=" in " ".join(reg["commands"][0]) and reg["commands"][0][:2] == ["helm", "upgrade"]

    await stats(s, 16, 16, 8)          # a tenant now waits for 8 GPUs (its pending request, or its guarantee)
    doc = await offering(s, lambda d: live(d, "reclaiming"), "a node reclaimed")
    [node] = live(doc, "reclaiming")
    assert doc["reserve_gpus"] == 8 and doc["reclaims_total"] == 1 and len(live(doc, "offered")) == 1
    notice = datetime.fromisoformat(node["reclaim_by"]) - datetime.fromisoformat(doc["updated_at"])
    assert timedelta(seconds=0.9) <= notice <= timedelta(seconds=1.1)
    [reclaim] = await eventually(lambda: calls(s.record, "reclaim_nodes"), timeout=20, what="the market told")
    assert reclaim["mode"] == "cordon_and_drain" and 0 < reclaim["grace_s"] <= 1
    assert ["kubectl", "cordon"] == reclaim["commands"][1][:2]
    # at the notice's end the offering releases it; then its GPUs are the pool's again
    [rel] = await eventually(lambda: mine(s, "allocation.release"), timeout=20, what="the node released")
    assert rel["allocation_id"] == node["allocation_id"]
    assert time.time() >= datetime.fromisoformat(node["reclaim_by"]).timestamp()
    await released(s.js, tenant, node["allocation_id"])
    doc = await offering(s, lambda d: live(d, "released"), "the node gone")
    assert doc["offered_gpus"] == 8 and doc["offered_gpu_s"] > 0


async def test_a_tenants_request_that_preempts_a_spot_node_reaches_the_market_with_the_schedulers_notice(spot):
    s = spot
    tenant = uuid.uuid4()
    reqs, _ = await grown(s, tenant, nodes=1)
    deadline = datetime.now(UTC) + timedelta(seconds=30)
    await publish_event(s.js, "scheduler.preemption_notice", {
        "allocation_id": reqs[0]["allocation_id"], "tenant_id": str(tenant), "node_id": str(uuid.UUID(int=1)),
        "reason": "a tenant's request needs the node", "preempted_for": str(uuid.uuid4()),
        "grace_deadline": deadline.isoformat()}, tenant_id=str(tenant))
    doc = await offering(s, lambda d: live(d, "reclaiming"), "the node reclaimed")
    assert "preempted by the scheduler" in live(doc, "reclaiming")[0]["reclaim_reason"]
    [reclaim] = await eventually(lambda: calls(s.record, "reclaim_nodes"), timeout=20, what="the market told")
    assert 25 <= reclaim["grace_s"] <= 30
    await stats(s, 8, 8, 0)     # figures taken meanwhile grow nothing: the node is on its way back
    await offering(s, lambda d: d["free_gpus"] == 0, "the figures seen")
    assert not mine(s, "allocation.release")   # the scheduler releases it


async def test_guaranteed_quota_and_headroom_are_never_offered(spot):
    s = spot
    await send_command(s.js, "paas.set_spot_offering", offering_cmd(s.pool, uuid.uuid4(), headroom_gpus=2))
    await offering(s, lambda d: d["enabled"], "the offering enabled")
    await stats(s, 0, 16, 7)        # 16 free, 7 claimable + 2 headroom: 7 spare, less than one 8-GPU node
    doc = await offering(s, lambda d: d["reserve_gpus"] == 9, "the figures seen")
    assert doc["free_gpus"] == 16 and not doc["nodes"]
    assert not mine(s, "allocation.request")


async def test_disabling_takes_every_node_back_with_notice_then_leaves_the_market(spot):
    s = spot
    tenant = uuid.uuid4()
    reqs, _ = await grown(s, tenant)
    await send_command(s.js, "paas.set_spot_offering", offering_cmd(s.pool, tenant, enabled=False))
    doc = await offering(s, lambda d: not d["enabled"] and len(live(d, "reclaiming")) == 2, "both reclaimed")
    assert doc["reason"].startswith("disabled by")
    await eventually(lambda: mine(s, "allocation.release"), timeout=20,
                     until=lambda r: len(r) == 2, what="both released at the notice's end")
    for r in reqs:
        await released(s.js, tenant, r["allocation_id"])
    await offering(s, lambda d: len(live(d, "released")) == 2, "both gone")
    await eventually(lambda: calls(s.record, "deregister"), timeout=20, what="the cluster deregistered")
