"""The gateway's node view against the scheduler's truth, both services real (NATS JetStream, PostgreSQL): after
every reservation and release — whole GPUs, MIG instances, a queued request placed when capacity frees, a
burst whose replies the gateway's consumers see in any order — GET /v1/nodes/{id} shows the free slots the
scheduler's own schema holds, and the node document's version does not move with them."""
from __future__ import annotations

import asyncio
import uuid

from tests.support.bus import send_command as send
from tests.support.gateway import PROJECTED_WITHIN_S, SLOT_MAP, node_doc, project
from tests.support.polling import eventually
from tests.support.scheduler import start


async def scheduler_truth(env, node: uuid.UUID) -> tuple[int, int]:
    """The scheduler's truth, from its schema: (slots of the schedulable node that no allocation holds, whole (no
    MIG instance), with a wipe policy, not retired; the node's capacity sequence)."""
    async with env.rt.pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM slots s JOIN nodes n ON n.id = s.node_id WHERE s.node_id=$1 "
            "AND n.status='schedulable' AND s.allocation_id IS NULL AND s.mig_used = 0 AND s.wipe_policy <> '' "
            "AND NOT s.retired) AS free, (SELECT seq FROM node_capacity WHERE node_id=$1) AS seq", node)
    return row["free"], row["seq"]


async def agrees(admin, env, node: uuid.UUID, expected: int) -> dict:
    """Wait until the gateway shows the scheduler's latest count and sequence (the count must be ``expected``);
    returns the node view."""
    async def probe():
        truth = await scheduler_truth(env, node)
        shown = (await admin.get(f"/v1/nodes/{node}")).body
        return truth, shown
    truth, shown = await eventually(
        probe, until=lambda v: (v[1].get("free_slots"), v[1].get("capacity_version")) == v[0],
        timeout=PROJECTED_WITHIN_S, what=f"the gateway to show the scheduler's free slots of node {node}")
    assert truth[0] == expected, (truth, expected)
    return shown


async def reserved(env, tenant: uuid.UUID, shape: str) -> dict:
    """Reserve and wait until it is placed (at once, or out of the queue); returns slots_reserved's data."""
    cmd = env.reserve_cmd(tenant, shape)
    await send(env.js, "scheduler.reserve_slots", cmd)
    reply = await env.reply(cmd["allocation_id"], ("scheduler.slots_reserved", "scheduler.slot_reservation_failed"))
    assert reply["type"] == "scheduler.slots_reserved", reply["data"]
    return reply["data"]


async def test_the_node_view_follows_the_schedulers_free_slots_as_allocations_come_and_go(run_service, nc, watch, api):
    env = await start(run_service, nc, watch)
    admin = await api.admin()
    tenant = uuid.uuid4()
    await env.grant(tenant, 64)
    node = await env.onboard()
    first = await agrees(admin, env, node, 8)
    assert first["status"] == "schedulable" and first["capacity_version"] >= 1
    seen = [first["capacity_version"]]

    async def step(expected: int) -> None:
        shown = await agrees(admin, env, node, expected)
        assert shown["version"] == first["version"], "slots taken or freed are not document changes"
        assert shown["capacity_version"] > seen[-1]
        seen.append(shown["capacity_version"])

    a = await reserved(env, tenant, "vm.2gpu")
    assert a["capacity"]["free_slots"] == 6 and a["capacity"]["seq"] > seen[-1]
    await step(6)
    b = await reserved(env, tenant, "vm.4gpu")
    await step(2)
    mig = [await reserved(env, tenant, "mig.1g.10gb") for _ in range(2)]      # two instances share one GPU
    assert mig[0]["slots"] == mig[1]["slots"]
    await step(1)

    waiting = await env.reserve(tenant, "vm.2gpu")                            # 1 free: it waits in the queue
    assert waiting["type"] == "scheduler.reservation_queued"
    released = await env.release(uuid.UUID(a["allocation_id"]))              # ...and is placed once a is released
    assert released["data"]["node_id"] == str(node) and released["data"]["slots_freed"] == 2
    placed = (await env.reply(waiting["data"]["allocation_id"], ("scheduler.slots_reserved",)))["data"]
    assert placed["node_id"] == str(node) and placed["capacity"]["seq"] > released["data"]["capacity"]["seq"]
    await step(1)

    # a burst: a release and reservations at once; the gateway's consumers apply their counts in any order
    burst = await asyncio.gather(env.release(uuid.UUID(b["allocation_id"])),
                                 *(reserved(env, tenant, "vm.1gpu") for _ in range(3)))
    await step(2)

    for m in mig:
        await env.release(uuid.UUID(m["allocation_id"]))
    await step(3)
    for r in [placed, *burst[1:]]:
        await env.release(uuid.UUID(r["allocation_id"]))
    await step(8)


async def test_a_count_applies_only_when_its_capacity_sequence_is_newer_whatever_message_carries_it(api, nc):
    """The scheduler played: counts arrive on three consumers (slots_reserved, slots_released, node_changed) in
    any order; the view keeps the one with the highest seq, and a document's version orders only the document."""
    admin = await api.admin()
    node_id, name = str(uuid.uuid4()), f"node-{uuid.uuid4().hex[:8]}"
    ready = dict(status="schedulable", proposal=None, proposed_slot_map=None, approved_slot_map=SLOT_MAP)

    def reply(step: str, **data) -> dict:
        saga = uuid.uuid4()
        return {"saga_id": saga, "step": step, "idempotency_key": f"{saga}:{step}", "allocation_id": uuid.uuid4(), **data}

    async def shown() -> tuple[int, int, int]:
        doc = (await admin.get(f"/v1/nodes/{node_id}")).body
        return doc["free_slots"], doc["capacity_version"], doc["version"]

    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, 2, free_slots=8,
                                                               capacity={"free_slots": 8, "seq": 1}, **ready))
    assert await shown() == (8, 1, 2)
    await project(api, nc, "scheduler.slots_released", reply("release_slots", slots_freed=2, node_id=node_id,
                                                             capacity={"free_slots": 5, "seq": 4}))
    await project(api, nc, "scheduler.slots_reserved", reply("reserve_slots", node_id=node_id, slots=[0, 1],
                                                             gpu_model="H100", capacity={"free_slots": 3, "seq": 3}))
    await project(api, nc, "scheduler.slots_reserved", reply("reserve_slots", node_id=node_id, slots=[2],
                                                             gpu_model="H100", capacity={"free_slots": 7, "seq": 2}))
    assert await shown() == (5, 4, 2)                          # seq 4 arrived first; 3 and 2 are older
    # a newer document with an older count: the document applies, the count stays
    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, 3, free_slots=8, cordoned=True,
                                                               capacity={"free_slots": 8, "seq": 1}, **ready))
    doc = (await admin.get(f"/v1/nodes/{node_id}")).body
    assert (doc["free_slots"], doc["capacity_version"], doc["version"], doc["cordoned"]) == (5, 4, 3, True)
    # not schedulable: 0 free, whatever the count; schedulable again: the newest count
    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, 4, free_slots=0, review=["gpu 3 missing"],
                                                               capacity={"free_slots": 5, "seq": 4},
                                                               **{**ready, "status": "needs_review"}))
    assert await shown() == (0, 4, 4)
    await project(api, nc, "scheduler.slots_released", reply("release_slots", slots_freed=1, node_id=node_id,
                                                             capacity={"free_slots": 6, "seq": 5}))
    await project(api, nc, "scheduler.node_changed", node_doc(node_id, name, 5, free_slots=6,
                                                               capacity={"free_slots": 6, "seq": 5}, **ready))
    assert await shown() == (6, 5, 5)
    # a count for a node the gateway has no document of yet is kept for when it comes
    early = str(uuid.uuid4())
    await project(api, nc, "scheduler.slots_reserved", reply("reserve_slots", node_id=early, slots=[0],
                                                             gpu_model="H100", capacity={"free_slots": 7, "seq": 9}))
    await project(api, nc, "scheduler.node_changed", node_doc(early, f"node-{early[:8]}", 2, free_slots=8,
                                                               capacity={"free_slots": 8, "seq": 8}, **ready))
    doc = (await admin.get(f"/v1/nodes/{early}")).body
    assert (doc["free_slots"], doc["capacity_version"]) == (7, 9)
