"""The node-agent's wipe step, re-wipe and burn-in through the bus (real NATS, PostgreSQL and loop devices):
a released slot's disk loses the tenant's data and the evidence says how and that it was checked; a wipe that
fails is answered as a slot to quarantine, never as a silent success; a redelivered command wipes once."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid
from functools import partial

import pytest

from services.node_agent.adapters.drivers import SimDriver
from services.node_agent.bootstrap import build
from shared.wire import step_key
from tests.support.bus import publish_from_node
from tests.support.bus import send_to_node as send
from tests.support.disks import LoopDisks

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("losetup"),
                                reason="loop devices need root and util-linux")
POLICY = "nvme-secure-erase+discard"


@pytest.fixture
async def disks(tmp_path):
    d = await asyncio.to_thread(LoopDisks(tmp_path / "disks", 2).attach)
    yield d
    await asyncio.to_thread(d.detach)


async def _node(run_service, disks: LoopDisks | None, **env) -> uuid.UUID:
    node_id = uuid.uuid4()
    environ = {**({"TESSERA_WIPE_DEVICES": json.dumps(disks.device_map())} if disks else {}), **env}
    await run_service("node_agent", partial(build, driver=SimDriver(), environ=environ), instance=str(node_id))
    return node_id


def _wipe_cmd(node_id: uuid.UUID, alloc: uuid.UUID, saga: uuid.UUID, slots=(0, 1), policy: str = POLICY) -> dict:
    details = [{"index": s, "gpu_pci": f"0000:1{s}:00.0", "nvme_pci": f"0000:5{s}:00.0", "ib_vf_pci": f"0000:4{s}:00.1",
                "ib_guid": "0002c90300000001", "numa": 0, "nvlink_domain": 0, "wipe_policy": policy} for s in slots]
    return {"saga_id": saga, "step": "wipe_slots", "idempotency_key": step_key(saga, "wipe_slots"),
            "allocation_id": alloc, "tenant_id": uuid.uuid4(), "node_id": node_id, "slots": list(slots),
            "slot_details": details}


async def test_released_slots_are_wiped_with_evidence_and_a_redelivery_wipes_once(run_service, nc, watch, disks):
    node = await _node(run_service, disks)
    replies = await watch(f"node_agent.evt.slots_wiped.{node}")
    alloc, saga = uuid.uuid4(), uuid.uuid4()
    await send(nc.jetstream(), "wipe_slots", node, _wipe_cmd(node, alloc, saga))
    reply = (await replies.wait_for(lambda i: i[1]["data"]["allocation_id"] == str(alloc), timeout=60))[0][1]["data"]
    assert reply["quarantine"] == []
    assert [e["slot"] for e in reply["evidence"]] == [0, 1]
    for e, dev in zip(reply["evidence"], disks.devices):
        assert e["ok"] and e["policy"] == POLICY and e["gpu_reset"] == "no-driver"
        [d] = e["devices"]
        assert (d["device"], d["method"], d["bytes"], d["verified"]) == (dev, "blkdiscard+wipefs", 8 << 20, True)
        assert any(c.startswith("nvme id-ctrl") for c in d["commands"]) and any("blkdiscard" in c for c in d["commands"])
    assert not await asyncio.to_thread(disks.has_pattern, 0) and not await asyncio.to_thread(disks.has_pattern, 1)
    await asyncio.to_thread(disks.fill)   # new data; the same command again must not wipe it
    await send(nc.jetstream(), "wipe_slots", node, _wipe_cmd(node, alloc, saga))
    await replies.wait_for(lambda i: i[1]["data"]["allocation_id"] == str(alloc) and len(replies.items) >= 2, timeout=30)
    assert await asyncio.to_thread(disks.has_pattern, 0)


async def test_a_wipe_that_fails_is_answered_as_a_slot_to_quarantine(run_service, nc, watch, disks):
    node = await _node(run_service, disks)
    replies = await watch(f"node_agent.evt.slots_wiped.{node}")
    await asyncio.to_thread(disks.set_read_only, 1)
    alloc = uuid.uuid4()
    await send(nc.jetstream(), "wipe_slots", node, _wipe_cmd(node, alloc, uuid.uuid4()))
    reply = (await replies.wait_for(lambda i: i[1]["data"]["allocation_id"] == str(alloc), timeout=60))[0][1]["data"]
    [q] = reply["quarantine"]
    assert q["slot"] == 1 and q["reason"]
    ok, failed = reply["evidence"]
    assert ok["ok"] and not failed["ok"] and failed["reason"] == q["reason"]
    assert not await asyncio.to_thread(disks.has_pattern, 0) and await asyncio.to_thread(disks.has_pattern, 1)


async def test_the_default_policy_never_falls_back_from_nvme_format(run_service, nc, watch, disks):
    node = await _node(run_service, disks)
    replies = await watch(f"node_agent.evt.slots_wiped.{node}")
    alloc = uuid.uuid4()
    await send(nc.jetstream(), "wipe_slots", node, _wipe_cmd(node, alloc, uuid.uuid4(), slots=(0,), policy="nvme-secure-erase"))
    reply = (await replies.wait_for(lambda i: i[1]["data"]["allocation_id"] == str(alloc), timeout=60))[0][1]["data"]
    assert [q["slot"] for q in reply["quarantine"]] == [0]   # a loop device is no NVMe controller
    assert await asyncio.to_thread(disks.has_pattern, 0)      # and nothing was destroyed by another method


async def test_a_sim_node_without_disks_says_its_wipe_was_simulated(run_service, nc, watch):
    node = await _node(run_service, None)
    replies = await watch(f"node_agent.evt.slots_wiped.{node}")
    alloc = uuid.uuid4()
    await send(nc.jetstream(), "wipe_slots", node, _wipe_cmd(node, alloc, uuid.uuid4(), slots=(3,)))
    reply = (await replies.wait_for(lambda i: i[1]["data"]["allocation_id"] == str(alloc), timeout=30))[0][1]["data"]
    [e] = reply["evidence"]
    assert e["ok"] and e["devices"][0]["method"] == "simulated" and e["gpu_reset"] == "simulated"


async def test_a_rewipe_answers_its_outcome_with_evidence(run_service, nc, watch, disks):
    node = await _node(run_service, disks)
    events = await watch(f"node_agent.evt.slot_rewiped.{node}")
    request = uuid.uuid4()
    await publish_from_node(nc, "node_agent.rewipe", node,
                            {"request_id": request, "node_id": node, "slot": 1, "requested_by": uuid.uuid4()})
    hit = (await events.wait_for(lambda i: i[1]["data"]["request_id"] == str(request), timeout=60))[0][1]["data"]
    # no slot detail: the default policy, which a loop device cannot satisfy (NVMe format only)
    assert hit["slot"] == 1 and hit["ok"] is False and "nvme" in hit["evidence"]["reason"].lower()


async def test_burn_in_reports_each_check_and_names_a_failed_one(run_service, nc, watch):
    node = await _node(run_service, None, TESSERA_BURN_IN="sim", TESSERA_SIM_BURN_IN="fail:temperature:GPU 3 at 91 C")
    events = await watch(f"node_agent.evt.burn_in_finished.{node}")
    run = uuid.uuid4()
    await publish_from_node(nc, "node_agent.burn_in", node, {"node_id": node, "run_id": run})
    hit = (await events.wait_for(lambda i: i[1]["data"]["run_id"] == str(run), timeout=30))[0][1]["data"]
    assert hit["passed"] is False
    assert {c["name"]: c["ok"] for c in hit["checks"]} == {
        "gpus_present": True, "retired_pages": True, "row_remap": True, "xid": True, "temperature": False, "nvme_read": True}
    assert next(c for c in hit["checks"] if c["name"] == "temperature")["detail"] == "GPU 3 at 91 C"
