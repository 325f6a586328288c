"""Each tenant's line of allocate sagas (TESSERA_SAGA_TENANT_INFLIGHT) in the coordinator, against real
NATS JetStream and PostgreSQL: the coordinator runs in-process (its real bootstrap); the test plays every
participant (tests/integration/test_saga.py's ``Participants``)."""
from __future__ import annotations

import json
import uuid
from functools import partial

from services.saga.bootstrap import build
from services.saga.domain.model import Policy
from services.saga.settings import SagaSettings
from tests.integration.test_saga import ALLOCATE_ORDER, Participants, saga_row
from tests.support.polling import eventually

LINE_OF_2 = SagaSettings(Policy(tenant_inflight=2), deadline_poll_s=0.05)
LINE_OF_1 = SagaSettings(Policy(tenant_inflight=1), deadline_poll_s=0.05)


def of_tenant(p: Participants, tenant_id: uuid.UUID) -> Participants:
    """Another allocation of ``tenant_id``, on the same watchers."""
    return Participants(p.js, p.watchers, p.events, uuid.uuid4(), tenant_id)


async def line(rt, tenant_id: uuid.UUID) -> tuple[int, list[uuid.UUID]]:
    """(the tenant's allocate sagas in flight, its waiting allocations in line order)."""
    async with rt.pool.acquire() as conn:
        n = await conn.fetchval("SELECT count(*) FROM sagas WHERE tenant_id=$1 AND kind='allocate' "
                                "AND status IN ('running', 'compensating')", tenant_id)
        waiting = await conn.fetch("SELECT allocation_id FROM saga_waiting WHERE tenant_id=$1 ORDER BY seq", tenant_id)
    return n, [r["allocation_id"] for r in waiting]


async def known(rt, allocation_id: uuid.UUID) -> bool:
    """The coordinator has handled the allocation's request: it has a saga, or it waits in line."""
    async with rt.pool.acquire() as conn:
        return await conn.fetchval("SELECT EXISTS (SELECT 1 FROM sagas WHERE allocation_id=$1) "
                                   "OR EXISTS (SELECT 1 FROM saga_waiting WHERE allocation_id=$1)", allocation_id)


async def request_in_turn(rt, ps: list[Participants]) -> None:
    """Request each allocation once the coordinator handled the one before (so line order is request order)."""
    for p in ps:
        await p.request()
        await eventually(partial(known, rt, p.allocation_id), timeout=20)


async def complete(p: Participants) -> None:
    for type_ in ALLOCATE_ORDER:
        await p.succeed(await p.command(type_))
    await p.event("saga.completed")


async def test_a_tenants_burst_runs_two_at_a_time_in_order_while_another_tenant_starts_at_once(run_service, watch, nc):
    rt = await run_service("saga", partial(build, saga=LINE_OF_2))
    first = await Participants.start(watch, nc)
    tenant_a = uuid.uuid4()
    a = [of_tenant(first, tenant_a) for _ in range(6)]
    await request_in_turn(rt, a)
    assert await line(rt, tenant_a) == (2, [p.allocation_id for p in a[2:]])
    assert not a[2].commands("scheduler.reserve_slots")        # it waits: nothing was sent for it

    b = of_tenant(first, uuid.uuid4())                               # another tenant, after A's six
    await b.request()
    await b.command("scheduler.reserve_slots")                      # starts at once, not behind A's line
    assert (await line(rt, tenant_a))[0] == 2

    for k, p in enumerate(a):                                        # each that ends lets the oldest waiting in
        await complete(p)
        if k + 2 < len(a):
            await a[k + 2].command("scheduler.reserve_slots")
        in_flight, waiting = await line(rt, tenant_a)
        assert in_flight <= 2 and waiting == [q.allocation_id for q in a[k + 3:]]
    rows = [await saga_row(rt, p.allocation_id) for p in a]
    assert all(r["status"] == "completed" for r in rows)
    # A's k+2-th saga was created in the transaction that completed its k-th (one clock: now())
    assert [r["created_at"] for r in rows[2:]] == [r["updated_at"] for r in rows[:4]]
    await complete(b)


async def test_a_saga_that_fails_gives_its_place_to_the_next_waiting_request(run_service, watch, nc):
    rt = await run_service("saga", partial(build, saga=LINE_OF_1))
    first = await Participants.start(watch, nc)
    tenant = uuid.uuid4()
    one, two = of_tenant(first, tenant), of_tenant(first, tenant)
    await request_in_turn(rt, [one, two])
    assert await line(rt, tenant) == (1, [two.allocation_id])
    await one.fail(await one.command("scheduler.reserve_slots"), "quota exceeded")
    await one.command("allocation.fail")
    await two.command("scheduler.reserve_slots")
    assert await line(rt, tenant) == (1, [])
    assert (await saga_row(rt, one.allocation_id))["status"] == "failed"


async def test_a_redelivered_request_neither_starts_twice_nor_waits_twice(run_service, watch, nc):
    rt = await run_service("saga", partial(build, saga=LINE_OF_2))
    first = await Participants.start(watch, nc)
    tenant = uuid.uuid4()
    a = [of_tenant(first, tenant) for _ in range(4)]
    await request_in_turn(rt, a)
    repeats = [await a[0].request(), await a[2].request(), await a[3].request()]   # new events, same allocations

    async def handled():
        async with rt.pool.acquire() as conn:
            return await conn.fetchval("SELECT count(*) FROM inbox WHERE event_id = ANY($1::uuid[])",
                                       [e.id for e in repeats]) == len(repeats)
    await eventually(handled, timeout=20)
    assert await line(rt, tenant) == (2, [a[2].allocation_id, a[3].allocation_id])
    await complete(a[0])
    await a[2].command("scheduler.reserve_slots")
    assert await line(rt, tenant) == (2, [a[3].allocation_id])
    assert len(a[0].commands("scheduler.reserve_slots")) == 1


async def test_two_coordinators_count_one_tenants_burst_together(run_service, watch, nc):
    rt = await run_service("saga", partial(build, saga=LINE_OF_2), instance="a")
    await run_service("saga", partial(build, saga=LINE_OF_2), instance="b")
    first = await Participants.start(watch, nc)
    tenant = uuid.uuid4()
    burst = [of_tenant(first, tenant) for _ in range(8)]
    for p in burst:                                                  # all at once: both replicas take some
        await p.request()

    async def all_known():
        return all([await known(rt, p.allocation_id) for p in burst])
    await eventually(all_known, timeout=20)
    in_flight, waiting = await line(rt, tenant)
    assert (in_flight, len(waiting)) == (2, 6)
    started = [p for p in burst if p.allocation_id not in waiting]
    for p in started:
        await p.command("scheduler.reserve_slots")
    assert all(not p.commands("scheduler.reserve_slots") for p in burst if p.allocation_id in waiting)


async def test_a_waiting_request_of_a_tenant_with_room_is_started_by_the_deadline_loop(run_service, watch, nc):
    """A hand-over an ending saga missed (the request was not committed when it looked) is not lost."""
    rt = await run_service("saga", partial(build, saga=LINE_OF_2))
    p = await Participants.start(watch, nc)
    data = {"allocation_id": str(p.allocation_id), "tenant_id": str(p.tenant_id), "shape": "vm.2gpu", "gpu_count": 2,
            "volume_gb": 20, "labels": {"team": "ml"}, "node_id": None}
    async with rt.pool.acquire() as conn:                            # as left by such a race: room, and a waiting row
        await conn.execute("INSERT INTO saga_waiting (allocation_id, tenant_id, input) VALUES ($1, $2, $3::jsonb)",
                           p.allocation_id, p.tenant_id, json.dumps(data))
    await p.command("scheduler.reserve_slots")
    await complete(p)
    assert await line(rt, p.tenant_id) == (0, [])


# --- places in line, and a release before the saga starts ----------------------------------------------------

async def three_of_a_tenant(run_service, watch, nc):
    """A coordinator with lines of one, and three allocations of one tenant requested in turn: the first starts,
    the other two wait. Returns (the coordinator, the tenant, the three)."""
    rt = await run_service("saga", partial(build, saga=LINE_OF_1))
    first = await Participants.start(watch, nc)
    tenant = uuid.uuid4()
    three = tuple(of_tenant(first, tenant) for _ in range(3))
    await request_in_turn(rt, list(three))
    return rt, tenant, three


async def told(p: Participants, position: int) -> dict:
    """Wait until the allocation was told ``position`` (1 = the next to start)."""
    return await p.event("saga.allocation_waiting", lambda d: d["position"] == position)


async def withdraw(p: Participants) -> None:
    """Play the gateway: a DELETE of the allocation while it is REQUESTED."""
    await p.publish("saga.withdraw", {"allocation_id": p.allocation_id, "tenant_id": p.tenant_id,
                                      "requested_by": uuid.uuid4()})


async def release_withdrawn(p: Participants) -> None:
    """Play the allocation: the coordinator's allocation.release makes it RELEASING; answer its release saga's
    only step, and wait for that saga to complete."""
    release = await p.command("allocation.release")
    # marked withdrawn: the one release a REQUESTED allocation takes (none of its allocate saga ran, nor will)
    assert (release["data"]["tenant_id"], release["data"]["withdrawn"]) == (str(p.tenant_id), True)
    await p.request_release(None)
    await p.succeed(await p.command("allocation.mark_released"))
    await p.event("saga.completed", lambda d: d["kind"] == "release")


async def test_waiting_allocations_are_told_their_places_as_the_line_moves(run_service, watch, nc):
    rt, tenant, (one, two, three) = await three_of_a_tenant(run_service, watch, nc)
    assert (await told(two, 1))["reason"] == "tenant_line"
    await told(three, 2)
    assert places_told(one) == []                                    # it started at once

    await complete(one)                                              # the line moves: two starts, three is next
    await two.command("scheduler.reserve_slots")
    await two.event("saga.allocation_left_line")                     # told it left the line, as it started
    await told(three, 1)
    assert (places_told(two), places_told(three)) == ([1], [2, 1])
    left = [e["data"]["allocation_id"] for _, e, _ in one.events.items if e["type"] == "saga.allocation_left_line"]
    assert left == [str(two.allocation_id)]                          # one started at once: it never waited
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT told_place FROM saga_waiting WHERE allocation_id=$1", three.allocation_id) == 1


def places_told(p: Participants) -> list[int]:
    """Every place the allocation was told so far, in order."""
    return [e["data"]["position"] for _, e, _ in p.events.items
            if e["type"] == "saga.allocation_waiting" and e["data"]["allocation_id"] == str(p.allocation_id)]


async def test_a_waiting_allocation_released_leaves_the_line_at_once_with_nothing_reserved(run_service, watch, nc):
    rt, tenant, (one, two, three) = await three_of_a_tenant(run_service, watch, nc)
    await told(three, 2)

    await withdraw(two)                                              # the first waiting one: three moves up
    await release_withdrawn(two)
    await told(three, 1)
    assert await line(rt, tenant) == (1, [three.allocation_id])
    row = await saga_row(rt, two.allocation_id, "release")
    assert (row["status"], await saga_row(rt, two.allocation_id)) == ("completed", None)   # no allocate saga
    for type_ in ("scheduler.reserve_slots", "scheduler.release_slots",
                  "billing.stop_meter", "storage.delete_volume", "network.detach_network"):
        assert not two.commands(type_), type_                      # nothing reserved, nothing to undo

    await withdraw(three)                                            # the last waiting one
    await release_withdrawn(three)
    assert await line(rt, tenant) == (1, [])
    assert not three.commands("scheduler.reserve_slots") and not three.commands("scheduler.release_slots")
    assert one.commands("scheduler.reserve_slots") and not one.commands("allocation.release")   # unaffected
    await complete(one)
    assert not two.commands("scheduler.reserve_slots") and not three.commands("scheduler.reserve_slots")
    await withdraw(two)                                              # repeated: nothing more
    await one.publish("saga.withdraw", {"allocation_id": one.allocation_id, "tenant_id": tenant,
                                        "requested_by": uuid.uuid4()})
    assert not (await one.command("allocation.release"))["data"]["withdrawn"]   # one is ACTIVE: released now
    assert len(two.commands("allocation.release")) == 1


async def test_a_release_racing_the_start_waits_for_the_saga_and_an_early_one_for_the_request(run_service, watch, nc):
    rt = await run_service("saga", partial(build, saga=LINE_OF_1))
    first = await Participants.start(watch, nc)
    tenant = uuid.uuid4()
    one, two = of_tenant(first, tenant), of_tenant(first, tenant)
    await one.request()
    await one.command("scheduler.reserve_slots")
    await withdraw(one)                                              # too late for the line: its saga runs

    async def kept():
        async with rt.pool.acquire() as conn:
            return await conn.fetchval("SELECT state FROM saga_withdrawals WHERE allocation_id=$1",
                                       one.allocation_id) == "after_start"
    await eventually(kept, timeout=20)
    for type_ in ALLOCATE_ORDER[:-1]:
        await one.succeed(await one.command(type_))
    assert not one.commands("allocation.release")                    # not while it provisions
    await one.succeed(await one.command("allocation.activate"))
    assert not (await one.command("allocation.release"))["data"]["withdrawn"]   # then the normal release

    await withdraw(two)                                              # before the coordinator had its request
    await eventually(partial(known_withdrawal, rt, two.allocation_id), timeout=20)
    await two.request()
    await release_withdrawn(two)
    assert not two.commands("scheduler.reserve_slots") and await line(rt, tenant) == (0, [])


async def known_withdrawal(rt, allocation_id: uuid.UUID) -> bool:
    async with rt.pool.acquire() as conn:
        return await conn.fetchval("SELECT EXISTS (SELECT 1 FROM saga_withdrawals WHERE allocation_id=$1)",
                                   allocation_id)
