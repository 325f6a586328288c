"""Replies handled in batches: each reply's new saga state is written in the batch's one statement with the
commands it sends (``UnitOfWork.write_last``), against real JetStream and PostgreSQL. Several sagas' states in
one statement, and a second reply to one saga in the same batch, which must see the first's state."""
from __future__ import annotations

import asyncio

from services.saga.bootstrap import build
from services.saga.domain.definitions import ALLOCATE
from tests.integration.test_saga import ALLOCATE_ORDER, Participants, saga_row


async def test_replies_answered_while_no_coordinator_runs_are_handled_in_batches_and_each_saga_moves_once(
        run_service, watch, nc):
    first = await run_service("saga", build)
    p = await Participants.start(watch, nc)
    sagas = [p] + [p.another() for _ in range(7)]
    await asyncio.gather(*(s.request() for s in sagas))
    reserves = await asyncio.gather(*(s.command("scheduler.reserve_slots") for s in sagas))
    await first.stop()
    # answered while nothing consumes them: the next coordinator finds them all waiting, and takes them in batches;
    # the first saga's reply is sent twice (a participant's redelivered answer, as a new message)
    for s, cmd in zip(sagas, reserves, strict=True):
        await s.succeed(cmd)
    await p.succeed(reserves[0])
    second = await run_service("saga", build)
    attaches = await asyncio.gather(*(s.command("network.attach_network") for s in sagas))
    async with second.pool.acquire() as conn:
        transactions = await conn.fetchval("SELECT count(DISTINCT xmin::text) FROM sagas WHERE allocation_id = ANY($1)",
                                           [s.allocation_id for s in sagas])
    assert transactions < len(sagas), "the replies were not handled in batches: nothing tested the batch's write"
    for s, cmd in zip(sagas, attaches, strict=True):
        await s.succeed(cmd)
        for type_ in ALLOCATE_ORDER[2:]:
            await s.succeed(await s.command(type_))
    for s in sagas:
        await s.event("saga.completed")
        assert [len(s.commands(t)) for t in ALLOCATE_ORDER] == [1] * len(ALLOCATE_ORDER)
        assert (await saga_row(second, s.allocation_id))["status"] == "completed"
    async with second.pool.acquire() as conn:
        steps = await conn.fetch("SELECT step, status, attempt FROM saga_steps WHERE saga_id = $1 AND phase = 'invoke'",
                                 (await saga_row(second, p.allocation_id))["id"])
    # the saga answered twice moved once: each step succeeded once, the one answered twice at its first attempt
    assert sorted((r["step"], r["status"]) for r in steps) == sorted((step, "succeeded") for step in ALLOCATE.names)
    assert {r["step"]: r["attempt"] for r in steps}["reserve_slots"] == 1
