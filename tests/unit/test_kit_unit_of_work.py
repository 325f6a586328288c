"""The unit of work keeps its outbox rows and step outcomes until its owner flushes them (one statement for a
whole batch), answers a key's kept outcome from memory, and a savepoint opened on its connection that rolls back
drops the rows emitted and the outcomes recorded inside it (no database: a fake connection records the
statements)."""
from __future__ import annotations

from shared import participant
from shared.contract import Catalog
from shared.outbox import Outbox
from shared.unit_of_work import UnitOfWork, Writes
from tests.support import batchprobe
from tests.support.bus import make_envelope


class _Retracted(Exception):
    pass


class FakeConnection:
    """Records every ``execute``; ``transaction()`` is a savepoint that does nothing."""

    def __init__(self):
        self.statements: list[tuple] = []

    async def execute(self, sql: str, *args):
        self.statements.append((sql, *args))

    def transaction(self):
        return _Nothing()


class _Nothing:
    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


def _unit(conn: FakeConnection, *, defer: bool, writes: Writes | None = None) -> UnitOfWork:
    outbox = Outbox(batchprobe.SERVICE, Catalog([batchprobe.CONTRACT]))
    cause = make_envelope(batchprobe.PING, {"n": 1}, correlation_id="c-1")
    return UnitOfWork(conn, outbox, name="test", causation=cause, defer=defer, writes=writes)


def _inserted_ids(conn: FakeConnection) -> list:
    return [i for sql, ids, *_ in conn.statements if sql.startswith("INSERT INTO outbox") for i in ids]


async def test_deferred_rows_of_several_units_are_written_in_one_statement_in_order():
    conn = FakeConnection()
    batch = Writes()        # as the consumer kit gives every unit of work of one batch
    first, second = _unit(conn, defer=True, writes=batch), _unit(conn, defer=True, writes=batch)
    a = await first.emit(batchprobe.PINGED, batchprobe.Ping(n=1))
    b = await second.emit(batchprobe.PINGED, batchprobe.Ping(n=2))
    c = await first.emit(batchprobe.PINGED, batchprobe.Ping(n=3))
    assert conn.statements == []
    await UnitOfWork.insert_pending([first, second])
    assert len(conn.statements) == 1
    assert _inserted_ids(conn) == [a.id, b.id, c.id]
    await UnitOfWork.insert_pending([first, second])   # nothing kept twice
    assert len(conn.statements) == 1


async def test_a_rolled_back_savepoint_drops_what_was_emitted_inside_it_written_or_not():
    for defer in (True, False):
        conn = FakeConnection()
        uow = _unit(conn, defer=defer)
        kept = await uow.emit(batchprobe.PINGED, batchprobe.Ping(n=1))
        try:
            async with uow.conn.transaction():
                await uow.emit(batchprobe.PINGED, batchprobe.Ping(n=-1))
                raise _Retracted
        except _Retracted:
            pass
        async with uow.conn.transaction():
            also = await uow.emit(batchprobe.PINGED, batchprobe.Ping(n=2))
        await uow.flush()
        handed: list = []
        uow.outbox.hand_over = handed.extend
        await uow.run_after_commit()
        assert [r.id for r in handed] == [kept.id, also.id]
        if defer:
            assert _inserted_ids(conn) == [kept.id, also.id]


async def test_kept_outcomes_are_answered_from_memory_and_written_with_the_rows_in_one_statement():
    conn = FakeConnection()
    batch = Writes()
    first, second = _unit(conn, defer=True, writes=batch), _unit(conn, defer=True, writes=batch)
    await first.record_outcome("saga-1:reserve", "deferred", '{"position": 1}')
    sent = await first.emit(batchprobe.PINGED, batchprobe.Ping(n=1))
    await second.record_outcome("saga-1:reserve", "done", '{"node": "n1"}')
    await second.record_outcome("saga-2:reserve", "failed", '{"reason": "no capacity"}')
    # a later unit of the same transaction sees what an earlier one recorded, without a round trip
    assert await participant.recorded(second, "saga-1:reserve") == participant.Outcome("done", {"node": "n1"})
    assert conn.statements == []
    await UnitOfWork.insert_pending([first, second])
    [(sql, ids, *_, keys, statuses, results)] = conn.statements
    assert sql.startswith("WITH recorded AS (INSERT INTO step_outcomes") and ids == [sent.id]
    # one row per key (an upsert touches a row once): the last outcome recorded for it
    assert (keys, statuses) == (["saga-1:reserve", "saga-2:reserve"], ["done", "failed"])
    assert results == ['{"node": "n1"}', '{"reason": "no capacity"}']


async def test_a_rolled_back_savepoint_drops_the_outcomes_recorded_inside_it():
    conn = FakeConnection()
    uow = _unit(conn, defer=True)
    await uow.record_outcome("saga-1:reserve", "done", "{}")
    try:
        async with uow.conn.transaction():
            await uow.record_outcome("saga-2:reserve", "done", "{}")
            raise _Retracted
    except _Retracted:
        pass
    assert uow.writes.outcome("saga-2:reserve") is None
    await uow.flush()
    [(sql, keys, statuses, results)] = conn.statements
    assert sql.startswith("INSERT INTO step_outcomes") and keys == ["saga-1:reserve"]


async def test_an_outcome_is_written_at_once_when_the_unit_of_work_does_not_defer():
    conn = FakeConnection()
    uow = _unit(conn, defer=False)
    await uow.record_outcome("saga-1:reserve", "done", '{"n": 1}')
    assert conn.statements[0][1:] == ("saga-1:reserve", "done", '{"n": 1}')


_LAST = ("UPDATE t SET v={1} WHERE id={0}", "INSERT INTO log (id, v) VALUES ({0}, {1})")


async def test_a_handlers_last_statement_is_written_in_the_batchs_one_statement_in_the_kits_first_run():
    conn = FakeConnection()
    batch = Writes()
    first, second = _unit(conn, defer=True, writes=batch), _unit(conn, defer=True, writes=batch)
    first.optimistic = second.optimistic = True     # the consumer kit's first run of a batch
    await first.write_last("row:1", _LAST, [1, "a"])
    sent = await first.emit(batchprobe.PINGED, batchprobe.Ping(n=1))
    await second.write_last("row:2", _LAST, [2, "b"])
    assert conn.statements == []
    await UnitOfWork.insert_pending([first, second])
    [(sql, ids, *rest)] = conn.statements
    assert ids == [sent.id] and rest[4:] == [1, "a", 2, "b"]
    assert sql == ("WITH w0 AS (UPDATE t SET v=$7 WHERE id=$6), w1 AS (INSERT INTO log (id, v) VALUES ($6, $7)), "
                   "w2 AS (UPDATE t SET v=$9 WHERE id=$8), w3 AS (INSERT INTO log (id, v) VALUES ($8, $9)) "
                   "INSERT INTO outbox" + sql.split(") INSERT INTO outbox", 1)[1])


async def test_a_last_statement_is_written_at_once_outside_the_kits_first_run_or_when_asked():
    conn = FakeConnection()
    uow = _unit(conn, defer=True)                  # a loop's, or the kit's run with savepoints: not optimistic
    await uow.write_last("row:1", _LAST[:1], [1, "a"])
    assert conn.statements == [("UPDATE t SET v=$2 WHERE id=$1", 1, "a")]
    uow.optimistic = True
    await uow.write_last("row:1", _LAST[:1], [1, "b"], now=True)
    assert conn.statements[-1] == ("UPDATE t SET v=$2 WHERE id=$1", 1, "b")
    await uow.flush()
    assert len(conn.statements) == 2                # nothing was kept


async def test_a_kept_last_statement_is_written_before_its_key_is_changed_or_read_again():
    conn = FakeConnection()
    uow = _unit(conn, defer=True)
    uow.optimistic = True
    await uow.write_last("row:1", _LAST[:1], [1, "a"])
    await uow.write_last("row:2", _LAST[:1], [2, "x"])
    await uow.write_last("row:1", _LAST[:1], [1, "b"])     # a second change of row 1: the first written now
    assert conn.statements == [("UPDATE t SET v=$2 WHERE id=$1", 1, "a")]
    await uow.write_last_now("row:1")                        # about to read row 1 again
    assert conn.statements[-1] == ("UPDATE t SET v=$2 WHERE id=$1", 1, "b")
    await uow.flush()
    assert conn.statements[-1] == ("UPDATE t SET v=$2 WHERE id=$1", 2, "x") and len(conn.statements) == 3


async def test_a_savepoint_writes_what_was_kept_before_it_and_drops_what_was_kept_inside_it_when_rolled_back():
    conn = FakeConnection()
    uow = _unit(conn, defer=True)
    uow.optimistic = True
    await uow.write_last("row:1", _LAST[:1], [1, "a"])
    try:
        async with uow.conn.transaction():
            assert conn.statements == [("UPDATE t SET v=$2 WHERE id=$1", 1, "a")]   # not undone with the savepoint
            await uow.write_last("row:2", _LAST[:1], [2, "x"])
            raise _Retracted
    except _Retracted:
        pass
    await uow.flush()
    assert conn.statements == [("UPDATE t SET v=$2 WHERE id=$1", 1, "a")]
