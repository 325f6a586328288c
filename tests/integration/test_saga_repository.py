"""The saga repository against a real PostgreSQL: a saga read under its lock sees what the previous holder of
the lock committed, whether or not it waited for it (``repository.get`` reads the steps in its own statement's
snapshot when nothing changed, with a second statement otherwise); the deadline loop's look (``repository.due``)
finds what each of its passes would; what the lines and the loop read does not grow with the sagas that ended."""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from services.saga.adapters import lines, repository
from services.saga.domain.model import Saga, StepRecord
from shared.db import migrate
from tests.support.pg import fresh_schema, reads_of
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


async def test_the_deadline_loops_look_finds_each_kind_of_work_and_nothing_once_it_is_gone(infra, provision):
    async with fresh_schema(provision, "sagaprobe", SAGA_SQL) as conn:   # empty: the other tests' sagas are not in it
        assert await repository.due(conn, 2) == (False, False, False)
        saga = Saga(uuid.uuid4(), "allocate", uuid.uuid4(), uuid.uuid4(), {"gpu_count": 1})
        await repository.create(conn, saga)
        passed = datetime.now(UTC) - timedelta(seconds=1)
        running = replace(saga, status="running", steps={("reserve_slots", "invoke"): StepRecord("invoked", deadline=passed)})
        await repository.save(conn, saga, running)
        assert await repository.due(conn, 2) == (True, False, False)
        answered = replace(running, steps={("reserve_slots", "invoke"): StepRecord("succeeded")})
        await repository.save(conn, running, answered)
        assert await repository.due(conn, 2) == (False, False, False)

        waiting = Saga(uuid.uuid4(), "allocate", uuid.uuid4(), saga.tenant_id, {"gpu_count": 1})
        await lines.enqueue(conn, waiting)   # its tenant has one saga in flight: room under a bound of 2, none under 1
        assert await repository.due(conn, 2) == (False, True, False)
        assert await repository.due(conn, 1) == (False, False, False)
        await lines.moved(conn, saga.tenant_id)
        assert await repository.due(conn, 1) == (False, False, True)
        await lines.clear_moves(conn, saga.tenant_id)
        assert await lines.take_next(conn, saga.tenant_id) is not None
        assert await repository.due(conn, 2) == (False, False, False)


async def test_the_lines_and_the_deadline_loop_read_the_open_sagas_not_every_saga_there_ever_was(infra, provision):
    """3,000 finished allocate sagas of three tenants, and one running: each statement that counts a tenant's
    sagas in flight or looks for open ones reads a handful of rows and index entries, under the generic plan
    that a prepared statement runs from its sixth execution on. With the states passed as a parameter that plan
    could not use the partial indexes (sagas_in_flight, sagas_open) and read every allocate saga there was."""
    async with fresh_schema(provision, "sagahistory", SAGA_SQL) as conn:
        tenant, others = uuid.uuid4(), [uuid.uuid4(), uuid.uuid4()]
        await conn.execute(
            "INSERT INTO sagas (id, kind, allocation_id, tenant_id, status, input) SELECT gen_random_uuid(), "
            "'allocate', gen_random_uuid(), ($1::uuid[])[1 + i % 3], 'completed', '{}' FROM generate_series(1, 3000) i",
            [tenant, *others])
        saga = Saga(uuid.uuid4(), "allocate", uuid.uuid4(), tenant, {"gpu_count": 1})
        await repository.create(conn, saga)
        await repository.save(conn, saga, replace(saga, status="running", steps={
            ("reserve_slots", "invoke"): StepRecord("invoked", deadline=datetime.now(UTC) + timedelta(minutes=5))}))
        await lines.enqueue(conn, Saga(uuid.uuid4(), "allocate", uuid.uuid4(), tenant, {"gpu_count": 1}))
        await conn.execute("ANALYZE sagas")
        await conn.execute("SET plan_cache_mode = force_generic_plan")

        reads = {}
        for name, call in [("read", lambda: lines.read(conn, tenant, uuid.uuid4(), 64)),
                           ("in_flight", lambda: lines.in_flight(conn, tenant, 64)),
                           ("short_lines", lambda: lines.short_lines(conn, 64)),
                           ("take_next_if_room", lambda: lines.take_next_if_room(conn, tenant, 1)),
                           ("due", lambda: repository.due(conn, 64)),
                           ("claim_due", lambda: repository.claim_due(conn, []))]:
            _, reads[name] = await reads_of(conn, "sagas", call)
        assert all(n <= 20 for n in reads.values()), reads
        assert await lines.in_flight(conn, tenant, 64) == 1   # and the counts are still right
        assert await lines.short_lines(conn, 64) == [tenant]
