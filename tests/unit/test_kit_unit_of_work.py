"""The unit of work keeps its outbox rows until its owner flushes them (one statement for a whole batch), and a
savepoint opened on its connection that rolls back drops the rows emitted inside it (no database: a fake
connection records the statements)."""
from __future__ import annotations

from shared.contract import Catalog
from shared.outbox import Outbox
from shared.unit_of_work import UnitOfWork
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


def _unit(conn: FakeConnection, *, defer: bool) -> UnitOfWork:
    outbox = Outbox(batchprobe.SERVICE, Catalog([batchprobe.CONTRACT]))
    cause = make_envelope(batchprobe.PING, {"n": 1}, correlation_id="c-1")
    return UnitOfWork(conn, outbox, name="test", causation=cause, defer=defer)


def _inserted_ids(conn: FakeConnection) -> list:
    return [i for sql, ids, *_ in conn.statements if sql.startswith("INSERT INTO outbox") for i in ids]


async def test_deferred_rows_of_several_units_are_written_in_one_statement_in_order():
    conn = FakeConnection()
    first, second = _unit(conn, defer=True), _unit(conn, defer=True)
    a = await first.emit(batchprobe.PINGED, batchprobe.Ping(n=1))
    b = await second.emit(batchprobe.PINGED, batchprobe.Ping(n=2))
    c = await first.emit(batchprobe.PINGED, batchprobe.Ping(n=3))
    assert conn.statements == []
    await UnitOfWork.insert_pending([first, second])
    assert len(conn.statements) == 1
    assert _inserted_ids(conn) == [a.id, c.id, b.id]
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
