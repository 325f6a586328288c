"""Scheduler against real NATS JetStream and PostgreSQL: node registration, first-fit reservation,
release and tombstones, redelivery, dead-lettering, and concurrent reservations that never share a slot.

The scheduler's inventory is shared by the whole test session, so each placement test first cordons
the nodes earlier tests left behind (``only_new_nodes``) and then registers its own."""
from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg

from services.scheduler import handlers
from services.scheduler.bootstrap import build
from services.scheduler.contracts import ReserveSlots
from shared.consumer import HandlerContext
from shared.wire import step_key
from tests.conftest import make_envelope, send_command as send, wait_handled

STREAM = "TESSERA_SCHEDULER"




async def handled(js, type_: str, seq: int, timeout: float = 20.0) -> None:
    await wait_handled(js, "scheduler", type_, seq, timeout)


def reserve_cmd(alloc: uuid.UUID, saga: uuid.UUID, gpus: int, shape: str = "vm.2gpu") -> dict:
    return {"saga_id": saga, "step": "reserve_slots", "idempotency_key": step_key(saga, "reserve_slots"),
            "allocation_id": alloc, "tenant_id": uuid.uuid4(), "shape": shape, "gpu_count": gpus}


def release_cmd(alloc: uuid.UUID, saga: uuid.UUID, compensates: str | None = None) -> dict:
    return {"saga_id": saga, "step": "release_slots", "idempotency_key": step_key(saga, "release_slots"),
            "allocation_id": alloc, "tenant_id": uuid.uuid4(), "compensates": compensates}


def of(alloc: uuid.UUID, type_: str):
    return lambda i: i[1]["type"] == type_ and i[1]["data"]["allocation_id"] == str(alloc)


async def only_new_nodes(rt) -> None:
    async with rt.pool.acquire() as conn:
        await conn.execute("UPDATE nodes SET cordoned = true WHERE NOT cordoned")


async def register(js, events, gpus: int = 8, name: str | None = None, model: str = "H100") -> uuid.UUID:
    node = uuid.uuid4()
    name = name or f"node-{node.hex[:12]}"
    await send(js, "scheduler.register_node", {"node_id": node, "name": name, "gpu_model": model, "gpu_count": gpus})
    await events.wait_for(lambda i: i[1]["type"] == "scheduler.node_registered" and i[1]["data"]["node_id"] == str(node))
    return node


async def held(rt, alloc: uuid.UUID) -> list[tuple[uuid.UUID, int]]:
    async with rt.pool.acquire() as conn:
        rows = await conn.fetch("SELECT node_id, idx FROM slots WHERE allocation_id=$1 ORDER BY idx", alloc)
    return [(r["node_id"], r["idx"]) for r in rows]


async def test_register_node_delivered_twice_creates_one_node_with_its_slots_and_one_event(run_service, nc, watch):
    rt = await run_service("scheduler", build)
    js, events = nc.jetstream(), await watch("scheduler.evt.>")
    node = uuid.uuid4()
    cmd = {"node_id": node, "name": f"node-{node.hex}", "gpu_model": "H100", "gpu_count": 4, "labels": {"rack": "r7"}}
    env, _ = await send(js, "scheduler.register_node", cmd)
    _, seq = await send(js, "scheduler.register_node", {}, env=env, msg_id=f"again-{env.id}")
    [hit] = await events.wait_for(lambda i: i[1]["type"] == "scheduler.node_registered" and i[1]["data"]["node_id"] == str(node))
    assert (hit[1]["data"]["gpu_count"], hit[1]["data"]["gpu_model"]) == (4, "H100")
    await handled(js, "scheduler.register_node", seq)
    async with rt.pool.acquire() as conn:
        n = await conn.fetchrow("SELECT * FROM nodes WHERE id=$1", node)
        slots = await conn.fetch("SELECT idx, allocation_id FROM slots WHERE node_id=$1 ORDER BY idx", node)
        events_written = await conn.fetchval("SELECT count(*) FROM outbox WHERE type='scheduler.node_registered' AND "
                                             "convert_from(body, 'UTF8')::jsonb->'data'->>'node_id' = $1", str(node))
    assert (json.loads(n["labels"]), n["cordoned"]) == ({"rack": "r7"}, False)
    assert [(s["idx"], s["allocation_id"]) for s in slots] == [(i, None) for i in range(4)]
    assert events_written == 1


async def test_registering_another_node_under_a_taken_name_is_dead_lettered(run_service, nc, watch):
    rt = await run_service("scheduler", build)
    js, events = nc.jetstream(), await watch("scheduler.evt.>")
    dead = await watch("deadletter.scheduler.>")
    name = f"node-{uuid.uuid4().hex}"
    first = await register(js, events, gpus=2, name=name)
    intruder = uuid.uuid4()
    env, _ = await send(js, "scheduler.register_node", {"node_id": intruder, "name": name, "gpu_model": "A100", "gpu_count": 8})
    [hit] = await dead.wait_for(lambda i: i[1]["id"] == str(env.id))
    assert hit[2]["Tessera-DLQ-Reason"] == "rejected" and str(first) in hit[2]["Tessera-DLQ-Error"]
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM nodes WHERE id=$1", intruder) == 0
        assert await conn.fetchval("SELECT count(*) FROM slots WHERE node_id=$1", intruder) == 0


async def test_reserve_takes_the_lowest_free_slots_of_the_first_node_by_name(run_service, nc, watch):
    rt = await run_service("scheduler", build)
    await only_new_nodes(rt)
    js, events = nc.jetstream(), await watch("scheduler.evt.>")
    tag = uuid.uuid4().hex
    later = await register(js, events, gpus=8, name=f"b-{tag}")
    first = await register(js, events, gpus=3, name=f"a-{tag}", model="A100")
    a1, a2, a3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for alloc, gpus in ((a1, 2), (a2, 2), (a3, 1)):
        await send(js, "scheduler.reserve_slots", reserve_cmd(alloc, uuid.uuid4(), gpus))
        await events.wait_for(of(alloc, "scheduler.slots_reserved"))
    assert await held(rt, a1) == [(first, 0), (first, 1)]
    assert await held(rt, a2) == [(later, 0), (later, 1)]   # only 1 left on the first node: never split
    assert await held(rt, a3) == [(first, 2)]
    [reply] = await events.wait_for(of(a1, "scheduler.slots_reserved"))
    assert (reply[1]["data"]["node_id"], reply[1]["data"]["slots"], reply[1]["data"]["gpu_model"]) == (str(first), [0, 1], "A100")


async def test_reserve_delivered_twice_or_retried_under_its_key_reserves_once(run_service, nc, watch):
    rt = await run_service("scheduler", build)
    await only_new_nodes(rt)
    js, events = nc.jetstream(), await watch("scheduler.evt.>")
    node = await register(js, events, gpus=8)
    alloc, saga = uuid.uuid4(), uuid.uuid4()
    env, _ = await send(js, "scheduler.reserve_slots", reserve_cmd(alloc, saga, 2))
    _, seq = await send(js, "scheduler.reserve_slots", {}, env=env, msg_id=f"again-{env.id}")
    await events.wait_for(of(alloc, "scheduler.slots_reserved"))
    await handled(js, "scheduler.reserve_slots", seq)
    retry, _ = await send(js, "scheduler.reserve_slots", reserve_cmd(alloc, saga, 2))
    [again] = await events.wait_for(lambda i: i[1].get("causation_id") == str(retry.id))
    assert again[1]["data"]["slots"] == [0, 1]
    assert await held(rt, alloc) == [(node, 0), (node, 1)]
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM slots WHERE node_id=$1 AND allocation_id IS NOT NULL", node) == 2


async def test_reserve_without_capacity_fails_naming_the_request_and_takes_nothing(run_service, nc, watch):
    rt = await run_service("scheduler", build)
    await only_new_nodes(rt)
    js, events = nc.jetstream(), await watch("scheduler.evt.>")
    node = await register(js, events, gpus=4)
    alloc = uuid.uuid4()
    await send(js, "scheduler.reserve_slots", reserve_cmd(alloc, uuid.uuid4(), 8, shape="vm.8gpu"))
    [hit] = await events.wait_for(of(alloc, "scheduler.slot_reservation_failed"))
    reason = hit[1]["data"]["reason"]
    assert reason.startswith("no capacity:") and "8 free GPU slot(s)" in reason and "vm.8gpu" in reason
    assert await held(rt, alloc) == []
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM slots WHERE node_id=$1 AND allocation_id IS NULL", node) == 4


async def test_release_frees_the_slots_and_is_idempotent(run_service, nc, watch):
    rt = await run_service("scheduler", build)
    await only_new_nodes(rt)
    js, events = nc.jetstream(), await watch("scheduler.evt.>")
    await register(js, events, gpus=4)
    alloc, saga = uuid.uuid4(), uuid.uuid4()
    await send(js, "scheduler.reserve_slots", reserve_cmd(alloc, saga, 4, shape="vm.4gpu"))
    await events.wait_for(of(alloc, "scheduler.slots_reserved"))
    release = release_cmd(alloc, uuid.uuid4())
    env, _ = await send(js, "scheduler.release_slots", release)
    [freed] = await events.wait_for(lambda i: i[1].get("causation_id") == str(env.id))
    assert freed[1]["type"] == "scheduler.slots_released" and freed[1]["data"]["slots_freed"] == 4
    assert await held(rt, alloc) == []
    env2, _ = await send(js, "scheduler.release_slots", release)
    [again] = await events.wait_for(lambda i: i[1].get("causation_id") == str(env2.id))
    assert again[1]["data"]["slots_freed"] == 0


async def test_compensation_before_the_reservation_leaves_a_tombstone_so_the_late_reserve_fails(run_service, nc, watch):
    rt = await run_service("scheduler", build)
    await only_new_nodes(rt)
    js, events = nc.jetstream(), await watch("scheduler.evt.>")
    await register(js, events, gpus=4)
    alloc, saga = uuid.uuid4(), uuid.uuid4()
    await send(js, "scheduler.release_slots", release_cmd(alloc, saga, compensates=step_key(saga, "reserve_slots")))
    await events.wait_for(of(alloc, "scheduler.slots_released"))
    await send(js, "scheduler.reserve_slots", reserve_cmd(alloc, saga, 2))
    [hit] = await events.wait_for(of(alloc, "scheduler.slot_reservation_failed"))
    assert "compensated" in hit[1]["data"]["reason"]
    assert await held(rt, alloc) == []


async def test_fifty_concurrent_reservations_fill_the_node_exactly_and_never_share_a_slot(run_service, provision, watch, nc):
    rt = await run_service("scheduler", build)
    await only_new_nodes(rt)
    node = await register(nc.jetstream(), await watch("scheduler.evt.>"), gpus=15)
    cmds = [ReserveSlots(**reserve_cmd(uuid.uuid4(), uuid.uuid4(), 2)) for _ in range(50)]
    dsn = await provision("scheduler")
    conns = [await asyncpg.connect(dsn) for _ in cmds]   # one connection (one transaction) per reservation

    async def reserve(conn: asyncpg.Connection, cmd: ReserveSlots) -> None:
        env = make_envelope("scheduler.reserve_slots", cmd.model_dump(mode="json"))
        async with conn.transaction():
            await handlers.reserve_slots(HandlerContext(conn, env, rt.outbox, "test"), cmd)

    try:
        await asyncio.gather(*(reserve(conn, cmd) for conn, cmd in zip(conns, cmds, strict=True)))
    finally:
        await asyncio.gather(*(conn.close() for conn in conns))
    async with rt.pool.acquire() as conn:
        outcomes = await conn.fetch("SELECT status, result FROM step_outcomes WHERE idempotency_key = ANY($1::text[])",
                                    [c.idempotency_key for c in cmds])
        taken = await conn.fetch("SELECT idx, allocation_id FROM slots WHERE node_id=$1 AND allocation_id IS NOT NULL", node)
    done = [json.loads(o["result"]) for o in outcomes if o["status"] == "done"]
    failed = [json.loads(o["result"]) for o in outcomes if o["status"] == "failed"]
    assert (len(done), len(failed)) == (7, 43)   # 15 slots hold seven 2-GPU reservations; one slot stays free
    assert all(f["reason"].startswith("no capacity:") for f in failed)
    reported = [(r["node_id"], i) for r in done for i in r["slots"]]
    assert len(reported) == len(set(reported)) == 14 and {n for n, _ in reported} == {str(node)}
    by_alloc: dict[uuid.UUID, int] = {}
    for t in taken:
        by_alloc[t["allocation_id"]] = by_alloc.get(t["allocation_id"], 0) + 1
    assert len(taken) == 14 and sorted(by_alloc.values()) == [2] * 7


async def test_two_replicas_consuming_concurrent_reservations_give_out_each_slot_once(run_service, nc, watch):
    first = await run_service("scheduler", build)
    await run_service("scheduler", build, instance="1")
    await only_new_nodes(first)
    js, events = nc.jetstream(), await watch("scheduler.evt.>")
    node = await register(js, events, gpus=6)
    allocs = [uuid.uuid4() for _ in range(20)]
    await asyncio.gather(*(send(js, "scheduler.reserve_slots", reserve_cmd(a, uuid.uuid4(), 1, shape="vm.1gpu")) for a in allocs))
    wanted = {str(a) for a in allocs}
    replies = ("scheduler.slots_reserved", "scheduler.slot_reservation_failed")

    def answered() -> dict[str, dict]:
        return {i[1]["data"]["allocation_id"]: i[1] for i in events.items
                if i[1]["type"] in replies and i[1]["data"]["allocation_id"] in wanted}

    await events.wait_for(lambda _: len(answered()) == len(wanted))
    outcome = answered()
    reserved = [e["data"]["slots"][0] for e in outcome.values() if e["type"] == "scheduler.slots_reserved"]
    assert sorted(reserved) == list(range(6))
    async with first.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(DISTINCT allocation_id) FROM slots WHERE node_id=$1", node) == 6


async def test_malformed_reserve_is_dead_lettered_and_the_next_valid_one_is_still_handled(run_service, nc, watch):
    rt = await run_service("scheduler", build)
    await only_new_nodes(rt)
    js, events = nc.jetstream(), await watch("scheduler.evt.>")
    dead = await watch("deadletter.scheduler.>")
    await register(js, events, gpus=2)
    bad, good = uuid.uuid4(), uuid.uuid4()
    malformed = reserve_cmd(bad, uuid.uuid4(), 1)
    del malformed["gpu_count"]
    env, _ = await send(js, "scheduler.reserve_slots", malformed)
    await send(js, "scheduler.reserve_slots", reserve_cmd(good, uuid.uuid4(), 1, shape="vm.1gpu"))
    [hit] = await dead.wait_for(lambda i: i[1]["id"] == str(env.id))
    assert hit[0] == "deadletter.scheduler.scheduler__scheduler_reserve_slots"
    assert hit[2]["Tessera-DLQ-Reason"] == "invalid" and "gpu_count" in hit[2]["Tessera-DLQ-Error"]
    await events.wait_for(of(good, "scheduler.slots_reserved"))
    assert await held(rt, bad) == []
    assert len(await held(rt, good)) == 1
