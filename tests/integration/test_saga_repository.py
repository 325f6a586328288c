"""The saga repository against a real PostgreSQL: a saga read under its lock sees what the previous holder of
the lock committed, whether or not it waited for it (``repository.get`` reads the steps in its own statement's
snapshot when nothing changed, with a second statement otherwise)."""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from pathlib import Path

import asyncpg

from services.saga.adapters import repository
from services.saga.domain.model import Saga, StepRecord
from shared.db import migrate
from tests.support.polling import eventually

SAGA_SQL = Path(repository.__file__).resolve().parents[1] / "schema"


async def _saga_conn(provision) -> asyncpg.Connection:
    dsn = await provision("saga")
    conn = await asyncpg.connect(dsn)
    await migrate(conn, "saga", SAGA_SQL)
    return conn


async def test_a_saga_read_while_another_holds_it_sees_the_step_that_holder_committed(infra, provision):
    holder, reader = await _saga_conn(provision), await _saga_conn(provision)
    observer = await asyncpg.connect(infra.admin_dsn)   # outside any transaction: pg_stat_activity is live
    try:
        saga = Saga(uuid.uuid4(), "allocate", uuid.uuid4(), uuid.uuid4(), {"gpu_count": 1})
        assert await repository.create(holder, saga) is not None
        tx = holder.transaction()
        await tx.start()
        before, _ = await repository.get(holder, saga.id)
        after = replace(before, current_step="reserve_slots",
                        steps={("reserve_slots", "invoke"): StepRecord("invoked", attempt=1)})
        await repository.save(holder, before, after)
        waiting = asyncio.create_task(repository.get(reader, saga.id))
        await eventually(lambda: _waits_on_a_lock(observer, reader), timeout=10)
        await tx.commit()
        seen, _ = await asyncio.wait_for(waiting, 10)
        assert seen.current_step == "reserve_slots"
        assert seen.steps[("reserve_slots", "invoke")].status == "invoked"
    finally:
        for conn in (holder, reader, observer):
            await conn.close()


async def test_an_uncontended_read_sees_the_committed_steps_and_the_clock(infra, provision):
    conn = await _saga_conn(provision)
    try:
        saga = Saga(uuid.uuid4(), "allocate", uuid.uuid4(), uuid.uuid4(), {"gpu_count": 1})
        await repository.create(conn, saga)
        await repository.save(conn, saga, replace(saga, steps={("reserve_slots", "invoke"): StepRecord("invoked")}))
        t0 = time.time()
        async with conn.transaction():
            seen, now = await repository.get(conn, saga.id)
        assert seen.steps[("reserve_slots", "invoke")].status == "invoked"
        assert abs(now.timestamp() - t0) < 60
    finally:
        await conn.close()


async def _waits_on_a_lock(observer: asyncpg.Connection, waiter: asyncpg.Connection) -> bool:
    pid = waiter.get_server_pid()
    return bool(await observer.fetchval(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid))
