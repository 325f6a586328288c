"""N callers at once against PostgreSQL, each on a connection (and so a transaction) of its own: the way
the tests prove that no pool value, slot or quota is ever given twice."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import asyncpg

from shared.unit_of_work import UnitOfWork
from tests.support.bus import make_envelope


async def run_concurrently(dsn: str, items: Sequence, fn: Callable[[asyncpg.Connection, object], Awaitable]) -> list:
    """``fn(conn, item)`` for every item, all at once, each on a connection of its own (opened first, closed
    after); returns the results in the items' order."""
    conns = [await asyncpg.connect(dsn) for _ in items]
    try:
        return await asyncio.gather(*(fn(conn, item) for conn, item in zip(conns, items, strict=True)))
    finally:
        await asyncio.gather(*(conn.close() for conn in conns))


async def run_handler_concurrently(rt, dsn: str, type_: str, cmds: Sequence, handler) -> list:
    """The service's ``handler(uow, cmd)`` for every command at once, each in its own connection and
    transaction, under a UnitOfWork on the service's outbox (as its consumer would run it)."""
    async def run(conn: asyncpg.Connection, cmd):
        env = make_envelope(type_, cmd.model_dump(mode="json"))
        async with conn.transaction():
            return await handler(UnitOfWork(conn, rt.outbox, name="test", causation=env), cmd)

    return await run_concurrently(dsn, cmds, run)
