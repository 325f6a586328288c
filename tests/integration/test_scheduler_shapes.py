"""Deleting a shape, decided by the scheduler for good (real NATS JetStream and PostgreSQL): a shape that
allocations use (placed or queued) or the platform's last shape is refused with admin_command_rejected and
stays; once the allocations are released it goes, and requests for it then fail ``unknown-shape``; a deletion
racing new reservations never leaves an allocation of a deleted shape.

The gateway refuses such a deletion first, from its read model (tests/integration/test_gateway_scheduling.py);
here the command reaches the scheduler as if that check had passed just before the allocations came."""
from __future__ import annotations

import asyncio
import json
import re
import uuid

from services.scheduler import contracts as c
from services.scheduler.handlers import define_shape
from shared.unit_of_work import UnitOfWork
from tests.support.bus import caused_by, make_envelope
from tests.support.bus import send_command as send
from tests.support.scheduler import start


async def defined(env, gpus: int = 4) -> str:
    """A fresh vm shape of ``gpus`` GPUs, once the scheduler has it."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    await send(env.js, "scheduler.define_shape", {"name": name, "kind": "vm", "gpu_count": gpus})
    await env.events.wait_for(lambda i: i[1]["type"] == "scheduler.shape_changed" and i[1]["data"]["name"] == name)
    return name


async def delete(env, name: str, gpus: int = 4) -> dict:
    """Send the deletion; returns what the scheduler answered (shape_changed or admin_command_rejected)."""
    cmd, _ = await send(env.js, "scheduler.define_shape", {"name": name, "kind": "vm", "gpu_count": gpus,
                                                           "deleted": True})
    [answer] = await env.events.wait_for(caused_by(cmd))
    return answer[1]


async def users(env, name: str) -> int:
    async with env.rt.pool.acquire() as conn:
        return await conn.fetchval("SELECT (SELECT count(*) FROM allocations WHERE shape=$1) + "
                                   "(SELECT count(*) FROM pending WHERE request->>'shape' = $1)", name)


async def test_a_shape_that_allocations_use_is_not_deleted_until_they_are_released(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 64)
    await env.onboard()
    name = await defined(env)
    placed = [await env.reserve(tenant, name, gpu_count=4) for _ in range(2)]
    queued = await env.reserve(tenant, name, gpu_count=4)
    assert [r["type"] for r in [*placed, queued]] == ["scheduler.slots_reserved"] * 2 + ["scheduler.reservation_queued"]

    refused = await delete(env, name)
    assert refused["type"] == "scheduler.admin_command_rejected"
    assert (refused["data"]["command"], refused["data"]["target"]) == ("scheduler.define_shape", name)
    assert "in use by 3 allocation(s)" in refused["data"]["reason"]
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT deleted FROM shapes WHERE name=$1", name) is False
    assert name in env.rt.scheduler.shapes

    await env.release(uuid.UUID(queued["data"]["allocation_id"]))         # a queued one is withdrawn
    for r in placed:
        await env.release(uuid.UUID(r["data"]["allocation_id"]))
    gone = await delete(env, name)
    assert gone["type"] == "scheduler.shape_changed" and gone["data"]["deleted"] is True
    late = await env.reserve(tenant, name, gpu_count=4)
    assert late["type"] == "scheduler.slot_reservation_failed" and late["data"]["code"] == "unknown-shape"
    assert await users(env, name) == 0


async def test_a_deletion_racing_new_reservations_never_leaves_an_allocation_of_a_deleted_shape(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 64)
    for _ in range(2):
        await env.onboard()
    for ahead in (0, 2, 6):              # how many reservations are sent before the deletion (the rest with it)
        name = await defined(env, gpus=1)
        cmds = [env.reserve_cmd(tenant, name, gpu_count=1) for _ in range(12)]
        await asyncio.gather(*(send(env.js, "scheduler.reserve_slots", cmd) for cmd in cmds[:ahead]))
        answer, *_ = await asyncio.gather(delete(env, name, gpus=1),
                                          *(send(env.js, "scheduler.reserve_slots", cmd) for cmd in cmds[ahead:]))
        replies = [await env.reply(cmd["allocation_id"]) for cmd in cmds]
        placed = [r for r in replies if r["type"] != "scheduler.slot_reservation_failed"]
        if answer["type"] == "scheduler.shape_changed":          # the deletion came first: nothing uses the shape
            assert answer["data"]["deleted"] is True and placed == []
            assert {r["data"]["code"] for r in replies} == {"unknown-shape"}
            assert await users(env, name) == 0
        else:                                                    # allocations came first: the shape stays
            assert answer["type"] == "scheduler.admin_command_rejected", answer
            counted = int(re.search(r"in use by (\d+) allocation", answer["data"]["reason"]).group(1))
            assert 1 <= counted <= len(placed) == await users(env, name)       # those placed before it, at least
            async with env.rt.pool.acquire() as conn:
                assert await conn.fetchval("SELECT deleted FROM shapes WHERE name=$1", name) is False
        for r in placed:
            await env.release(uuid.UUID(r["data"]["allocation_id"]))


async def test_the_platforms_last_shape_is_not_deleted(run_service, nc, watch):
    """Made the last live shape inside a transaction that is rolled back (the session's other tests share the
    catalog), the deletion is handled there by the scheduler's own handler and refused."""
    env = await start(run_service, nc, watch)
    name = await defined(env, gpus=1)
    cmd = c.DefineShape(name=name, kind="vm", gpu_count=1, deleted=True)
    async with env.rt.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute("UPDATE shapes SET deleted = true WHERE name <> $1", name)
            cause = make_envelope("scheduler.define_shape", cmd.model_dump(mode="json"))
            await define_shape(UnitOfWork(conn, env.rt.outbox, name="test", causation=cause), cmd,
                               active=env.rt.scheduler)
            sent = await conn.fetch("SELECT type, convert_from(body, 'UTF8')::jsonb->'data' AS data FROM outbox "
                                    "WHERE convert_from(body, 'UTF8')::jsonb->>'causation_id' = $1", str(cause.id))
            assert await conn.fetchval("SELECT deleted FROM shapes WHERE name=$1", name) is False
        finally:
            await tx.rollback()
    assert [r["type"] for r in sent] == ["scheduler.admin_command_rejected"]
    assert "the platform's last shape" in json.loads(sent[0]["data"])["reason"]
    assert name in env.rt.scheduler.shapes
