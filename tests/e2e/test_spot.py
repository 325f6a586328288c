"""The provider's spot offering on the whole platform: it grows into a pool's idle GPUs, gives a node back with notice
when a paying tenant allocates, is billed as spot, and leaves the market when disabled. The market is the
NVCF-shaped recording driver: its calls are read from the platform's PaaS state folder."""
from __future__ import annotations

import json
import time
from datetime import datetime

from tests.e2e.test_cli import cli_env, ok
from tests.e2e.test_scheduling import dedicated_pool
from tests.support.polling import eventually
from tooling import paas_state

NOTICE_S = 2


def market_calls(platform, pool: str, call: str) -> list[dict]:
    record = paas_state.state_dir(platform.workdir) / "spot" / f"{pool}.jsonl"
    if not record.exists():
        return []
    return [c for c in map(json.loads, record.read_text().splitlines()) if c["call"] == call]


async def offering(admin, pool: str, until, what: str, timeout: float = 60) -> dict:
    async def read():
        status, doc, _ = await admin.request("GET", f"/v1/spot-offerings/{pool}", expect=(200, 404))
        return doc if status == 200 else None
    return await eventually(read, timeout=timeout, until=lambda d: d is not None and until(d), what=what)


def nodes(doc: dict, state: str) -> list[dict]:
    return [n for n in doc["nodes"] if n["state"] == state]


async def test_the_spot_offering_follows_idle_capacity_and_gives_it_back_with_notice(platform, admin, make_tenant,
                                                                                      tmp_path):
    provider, payer = await make_tenant(), await make_tenant()
    pool, _, opts = await dedicated_pool(platform, admin, provider, payer, nodes=2)
    ops = cli_env(tmp_path, platform.gateway_url, platform.admin_key)
    said = await ok(ops, "spot", "enable", pool, "--tenant", provider.id, "--shape", "vm.8gpu", "--notice",
                    str(NOTICE_S), "--max-nodes", "4", "--toleration", opts["tolerations"][0])
    assert f"spot offering of pool {pool} enabled" in said
    try:
        grown = await offering(admin, pool, lambda d: len(nodes(d, "offered")) == 2, "both idle nodes offered")
        assert grown["offered_gpus"] == 16 and grown["driver"] == "recording"
        listed = json.loads(await ok(ops, "spot", "get", pool, "-o", "json"))
        assert listed["pool"] == pool and listed["enabled"] and listed["notice_s"] == NOTICE_S
        held = [a for a in (await provider.admin.allocations())["items"] if a["state"] == "ACTIVE"]
        assert len(held) == 2 and all(a["spot"] and a["pool"] == pool for a in held)
        await eventually(lambda: market_calls(platform, pool, "offer_nodes"), timeout=30,
                         until=lambda c: sum(len(x["commands"]) for x in c) == 4, what="both nodes in the market")

        asked = time.monotonic()
        paid = await payer.user.create_allocation("paying", "vm.8gpu", **opts)
        active = await payer.user.wait_state(paid["id"], "ACTIVE", timeout=NOTICE_S + 30)
        assert time.monotonic() - asked <= NOTICE_S + 30
        doc = await offering(admin, pool, lambda d: nodes(d, "released"), "the preempted node gone")
        [gone] = nodes(doc, "released")
        assert "preempted by the scheduler" in gone["reclaim_reason"] and gone["node_id"] == active["node_id"]
        [reclaim] = market_calls(platform, pool, "reclaim_nodes")
        assert reclaim["mode"] == "cordon_and_drain" and reclaim["grace_s"] <= NOTICE_S

        spot_line = await eventually(lambda: provider.admin.usage("group_by=spot"), timeout=30,
                                     until=lambda u: [g for g in u["groups"] if g["key"] == "spot"
                                                      and float(g["gpu_seconds"]) > 0], what="a spot usage line")
        assert not [g for g in spot_line["groups"] if g["key"] == "on-demand"]
    finally:
        await ok(ops, "spot", "disable", pool)
        done = await offering(admin, pool, lambda d: not d["enabled"] and not [
            n for n in d["nodes"] if n["state"] in ("requested", "offered", "reclaiming")], "every spot node back")
    ended = [n for n in done["nodes"] if n["state"] == "released"]
    assert all(datetime.fromisoformat(n["ended_at"]) >= datetime.fromisoformat(n["reclaim_by"]) for n in ended)
    await eventually(lambda: market_calls(platform, pool, "deregister"), timeout=30, what="the market left")
