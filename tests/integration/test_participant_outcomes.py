"""A participant's step outcomes against a real PostgreSQL: ``participant.recorded`` locks the key and reads its
outcome in one round trip, and a reader that waited for the key's lock sees the outcome the previous holder
committed (the read's snapshot follows the lock), whether that holder wrote it at once or kept it for its
commit (``UnitOfWork.record_outcome`` when deferring)."""
from __future__ import annotations

import asyncio

import asyncpg

from shared import participant
from shared.contract import Catalog
from shared.db import migrate
from shared.outbox import Outbox
from shared.unit_of_work import UnitOfWork
from tests.support import batchprobe
from tests.support.polling import eventually

SCHEMA = "outcomeprobe"


async def _conn(provision) -> asyncpg.Connection:
    conn = await asyncpg.connect(await provision(SCHEMA))
    await migrate(conn, SCHEMA, None)
    return conn


def _unit(conn: asyncpg.Connection, *, defer: bool) -> UnitOfWork:
    return UnitOfWork(conn, Outbox(SCHEMA, Catalog([batchprobe.CONTRACT])), name="test", defer=defer)


async def _waits_on_a_lock(observer: asyncpg.Connection, waiter: asyncpg.Connection) -> bool:
    return bool(await observer.fetchval("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                                        waiter.get_server_pid()))


async def test_a_reader_that_waited_for_the_key_sees_the_outcome_its_holder_committed(infra, provision):
    holder, reader = await _conn(provision), await _conn(provision)
    observer = await asyncpg.connect(infra.admin_dsn)
    try:
        for n, defer in enumerate((False, True)):
            key = f"saga-{n}:reserve_slots"
            tx = holder.transaction()
            await tx.start()
            first = _unit(holder, defer=defer)
            assert await participant.recorded(first, key) is None
            await first.record_outcome(key, "done", '{"node": "n1"}')
            await first.flush()
            async with reader.transaction():
                waiting = asyncio.create_task(participant.recorded(_unit(reader, defer=True), key))
                await eventually(lambda r=reader: _waits_on_a_lock(observer, r), timeout=10,
                                 what="the reader to wait for the key's lock")
                await tx.commit()
                assert await asyncio.wait_for(waiting, 10) == participant.Outcome("done", {"node": "n1"})
    finally:
        for conn in (holder, reader, observer):
            await conn.close()


async def test_a_key_never_handled_reads_as_none_and_is_locked_until_the_transaction_ends(infra, provision):
    conn, other = await _conn(provision), await _conn(provision)
    try:
        async with conn.transaction():
            assert await participant.recorded(_unit(conn, defer=True), "saga-x:step") is None
            taken = await other.fetchval("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))", "saga-x:step")
            assert taken is False
    finally:
        await conn.close()
        await other.close()


async def test_a_batch_reads_its_keys_ahead_locked_and_its_handlers_are_answered_from_them(infra, provision):
    conn, other = await _conn(provision), await _conn(provision)
    try:
        await conn.execute("INSERT INTO step_outcomes (idempotency_key, status, result) VALUES ($1, 'done', $2)",
                           "saga-b:step", '{"node": "n2"}')
        async with conn.transaction():
            uow = _unit(conn, defer=True)
            await uow.writes.read_ahead(conn, ["saga-a:step", "saga-b:step", "saga-c:step"])
            assert await participant.recorded(uow, "saga-b:step") == participant.Outcome("done", {"node": "n2"})
            assert await participant.recorded(uow, "saga-c:step") is None
            for key in ("saga-a:step", "saga-c:step"):      # every key is locked, read or not
                assert await other.fetchval("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))", key) is False
            await uow.record_outcome("saga-c:step", "done", "{}")   # what it recorded since answers first
            assert await participant.recorded(uow, "saga-c:step") == participant.Outcome("done", {})
    finally:
        await conn.close()
        await other.close()
