"""Releases against real NATS JetStream and PostgreSQL: the schema's ``withdraw_each`` (a batch's releases in one
round trip) answers per allocation what ``withdraw`` would, in order; releases sent together are each answered
and free what they held once. The world each test starts is in tests/support/scheduler.py."""
from __future__ import annotations

import asyncio
import uuid

from services.scheduler.adapters import claims
from tests.support.scheduler import start


async def test_withdraw_each_answers_per_allocation_in_order_what_withdraw_would(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 16)
    node = await env.onboard()
    held = uuid.UUID((await env.reserve(tenant, "vm.8gpu"))["data"]["allocation_id"])
    waiting = await env.reserve(tenant, "vm.8gpu")
    assert waiting["type"] == "scheduler.reservation_queued"
    queued, unknown = uuid.UUID(waiting["data"]["allocation_id"]), uuid.uuid4()
    async with env.rt.pool.acquire() as conn:
        tr = conn.transaction()
        await tr.start()
        try:
            answers = await claims.withdraw_each(conn, [held, queued, unknown, held])
            used = await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1", tenant)
        finally:
            await tr.rollback()            # the service's index still holds them: leave SQL as it was
    (row, capacity, none), (no_row, no_capacity, entry), nothing, again = answers
    assert (row["allocation_id"], row["node_id"], row["slots"], none) == (held, node, list(range(8)), None)
    assert capacity["free_slots"] == 8 and capacity["seq"] >= 1
    assert (no_row, no_capacity, entry["allocation_id"]) == (None, None, str(queued))
    assert nothing == again == (None, None, None) and used == 0
    assert [(n, i) for n, i in await env.held(held)] == [(node, i) for i in range(8)]


async def test_releases_sent_together_are_each_answered_and_free_what_they_held_once(run_service, nc, watch):
    env = await start(run_service, nc, watch)
    tenant = uuid.uuid4()
    await env.grant(tenant, 8)
    node = await env.onboard()
    allocs = [uuid.UUID((await env.reserve(tenant, "vm.2gpu"))["data"]["allocation_id"]) for _ in range(4)]
    freed = await asyncio.gather(*(env.release(a) for a in [*allocs, allocs[0]]))
    assert sorted(f["data"]["slots_freed"] for f in freed) == [0, 2, 2, 2, 2]
    assert {f["data"]["node_id"] for f in freed if f["data"]["slots_freed"]} == {str(node)}
    assert max(f["data"]["capacity"]["free_slots"] for f in freed if f["data"]["capacity"]) == 8
    assert [await env.held(a) for a in allocs] == [[]] * 4
    async with env.rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT used FROM quotas WHERE tenant_id=$1", tenant) == 0
    again = await env.reserve(tenant, "vm.8gpu")               # the index freed all eight
    assert again["type"] == "scheduler.slots_reserved" and again["data"]["node_id"] == str(node)
