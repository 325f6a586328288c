"""The unit of work: one PostgreSQL transaction, the messages it causes, and what runs after it commits.

Every transaction a service opens is a ``UnitOfWork``: the consumer kit opens one per message (its
``causation`` is that message), a background loop or an HTTP handler opens one with ``UnitOfWork.begin``
(no causation: it names its own correlation id). State changes and outbox rows commit together or not at
all; ``on_commit`` callbacks run only once the transaction has committed (for in-memory state that must
not run ahead of the database).

A unit of work that ``defers`` its writes (the consumer kit's, ``begin``'s) keeps its outbox rows and the step
outcomes its participant records (``shared.participant``) and writes them all in one statement just before the
commit (``flush``; a batch's units of work share one ``Writes``, so a whole batch writes once) instead of one
statement per ``emit`` and per outcome. In the consumer kit's first run of a batch a handler may also leave its
own last write to that statement (``write_last``: the saga's new state), one round trip fewer per message. A
savepoint a handler opens on ``conn`` (``conn.transaction()``) that rolls back drops the rows and outcomes kept
inside it, written or not, so nothing it emitted is ever published.
"""
from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import asyncpg
import structlog
from pydantic import BaseModel

from .envelope import Envelope
from .outbox import INSERT_ROWS, Outbox, Row

log = structlog.get_logger()


_RECORD = ("INSERT INTO step_outcomes (idempotency_key, status, result) "
           "SELECT * FROM unnest({}::text[], {}::text[], {}::jsonb[]) ON CONFLICT (idempotency_key) "
           "DO UPDATE SET status = EXCLUDED.status, result = EXCLUDED.result, updated_at = now()")
_RECORD_ONE = ("INSERT INTO step_outcomes (idempotency_key, status, result) VALUES ($1, $2, $3::jsonb) "
               "ON CONFLICT (idempotency_key) DO UPDATE SET status = EXCLUDED.status, result = EXCLUDED.result, "
               "updated_at = now()")
# a statement a handler left to the batch's write (``UnitOfWork.write_last``): its data-modifying queries, written
# with {0}, {1}... for its parameters, and the parameters
Last = tuple[tuple[str, ...], list]


def one_statement(rows: list[tuple], outcomes: dict[str, tuple[str, str]], last: list[Last]) -> tuple:
    """What a transaction keeps, as one statement (its SQL, then its parameters, as ``execute`` takes them):
    the step outcomes and the handlers' last statements as data-modifying WITH queries (each runs to
    completion; all see the transaction as it was before the statement), the outbox rows as its main query."""
    args: list = []

    def param(value) -> str:
        args.append(value)
        return f"${len(args)}"

    send = INSERT_ROWS.format(*(param(list(c)) for c in zip(*rows))) if rows else None
    queries = [("recorded", _RECORD.format(param(list(outcomes)), param([v[0] for v in outcomes.values()]),
                                           param([v[1] for v in outcomes.values()])))] if outcomes else []
    for parts, values in last:
        names = [param(v) for v in values]
        for part in parts:
            queries.append((f"w{len(queries)}", part.format(*names)))
    main = send if send is not None else queries.pop()[1]
    if queries:
        main = "WITH " + ", ".join(f"{name} AS ({q})" for name, q in queries) + " " + main
    return main, *args


class RunUnderSavepoint(Exception):
    """Raised by a handler of an ``optimistic`` unit of work whose work failed in part and must be undone alone:
    the consumer kit rolls the batch back and runs it again at once, each handler under a savepoint."""


class Later(Protocol):
    """Work several handlers of one batch left to be done at once before the batch writes (``Writes.later``)."""

    async def flush(self) -> None: ...


class Writes:
    """What the units of work of one transaction keep to write just before it commits: outbox rows (id,
    subject, type, headers JSON, body) and step outcomes (key, status, result JSON), each in order."""

    def __init__(self) -> None:
        self.outbox: list[tuple] = []
        self.outcomes: list[tuple[str, str, str]] = []
        # step keys this transaction locked and read ahead (a batch of step commands): key -> the
        # (status, result JSON) recorded before it, None when none was
        self.known: dict[str, tuple[str, str] | None] = {}
        # a batch of several messages run without savepoints (the consumer kit's first attempt): its handlers
        # may leave work of the same kind to be done once for all of them, just before the write (``later``)
        self.batched = False
        self.later: dict[str, Later] = {}
        # the handlers' last statements, by what each changes (``UnitOfWork.write_last``)
        self.last: dict[str, Last] = {}

    def outcome(self, key: str) -> tuple[str, str] | None:
        """The (status, result JSON) last kept for ``key`` and not written yet, if any."""
        for kept, status, result in reversed(self.outcomes):
            if kept == key:
                return status, result
        return None

    async def read_ahead(self, conn: asyncpg.Connection, keys: list[str]) -> None:
        """Lock ``keys`` (sorted) until the transaction ends and read their recorded outcomes, in one round trip
        (the kit's function ``step_outcomes_locked``), for ``shared.participant.recorded`` to answer from."""
        self.known.update(dict.fromkeys(keys))
        for row in await conn.fetch("SELECT key, status, result FROM step_outcomes_locked($1::text[])", keys):
            self.known[row["key"]] = (row["status"], row["result"])

    async def write(self, conn: asyncpg.Connection) -> None:
        """Do the work the handlers left for later (``later``, in the order it was first left; it may keep
        more rows and outcomes), then write everything kept, in one statement, and forget it."""
        while self.later:
            name = next(iter(self.later))
            await self.later.pop(name).flush()
        # one row per key (an upsert may not touch a row twice): the last outcome kept for it
        rows, latest = self.outbox, {key: (status, result) for key, status, result in self.outcomes}
        last = list(self.last.values())
        self.outbox, self.outcomes, self.last = [], [], {}
        if rows or latest or last:
            await conn.execute(*one_statement(rows, latest, last))

    async def write_last_now(self, conn: asyncpg.Connection, key: str | None = None) -> None:
        """Write the last statements kept (``key``'s, or all), at once."""
        if key is None:
            kept, self.last = list(self.last.values()), {}
        else:
            kept = [self.last.pop(key)] if key in self.last else []
        if kept:
            await conn.execute(*one_statement([], {}, kept))


class _Savepoint:
    """``conn.transaction()`` inside a unit of work: a savepoint that, when it rolls back, also forgets the
    outbox rows emitted and the step outcomes recorded inside it."""

    def __init__(self, uow: UnitOfWork, inner):
        self._uow, self._inner = uow, inner
        self._marks = (0, 0, 0)

    async def __aenter__(self):
        writes = self._uow.writes
        await writes.write_last_now(self._uow.conn.raw)   # kept before the savepoint: not undone with it
        self._marks = (len(self._uow._queued), len(writes.outbox), len(writes.outcomes))
        return await self._inner.__aenter__()

    async def __aexit__(self, exc_type, exc, tb):
        try:
            return await self._inner.__aexit__(exc_type, exc, tb)
        finally:
            if exc_type is not None:   # rolled back
                writes = self._uow.writes
                del self._uow._queued[self._marks[0]:]
                del writes.outbox[self._marks[1]:]
                del writes.outcomes[self._marks[2]:]
                writes.last.clear()


class _Connection:
    """The unit of work's connection: the asyncpg connection itself but for ``transaction()`` (see
    ``_Savepoint``)."""

    def __init__(self, raw: asyncpg.Connection, uow: UnitOfWork):
        self.raw, self._uow = raw, uow

    def transaction(self, **kwargs) -> _Savepoint:
        return _Savepoint(self._uow, self.raw.transaction(**kwargs))

    def __getattr__(self, name: str):
        return getattr(self.raw, name)


class UnitOfWork:
    """What a handler gets: the open transaction (``conn``), the message that caused the work (``causation``,
    None for work a loop or an HTTP request starts), and an emitter that writes to the outbox in that
    transaction."""

    def __init__(self, conn: asyncpg.Connection, outbox: Outbox, *, name: str, causation: Envelope | None = None,
                 defer: bool = False, writes: Writes | None = None):
        """``defer``: keep the outbox rows and step outcomes in ``writes`` (shared by the units of work of one
        transaction; a new one when not given) until ``flush`` (or the batch's ``insert_pending``), which the
        owner of the transaction must call before it commits."""
        self.conn = _Connection(conn, self) if conn is not None else conn
        self.outbox, self.name, self.causation, self.defer = outbox, name, causation, defer
        self.writes = writes if writes is not None else Writes()
        # the consumer kit's first run of a batch: no savepoint around the handler, and the whole batch is run
        # again, each handler under a savepoint, when one raises RunUnderSavepoint (shared.participant.invoke)
        self.optimistic = False
        self._after_commit: list[Callable[[], Awaitable[None]]] = []
        self._queued: list[Row] = []   # the outbox rows it wrote, handed to the relay once committed

    @classmethod
    @contextlib.asynccontextmanager
    async def begin(cls, pool: asyncpg.Pool, outbox: Outbox, *, name: str,
                    causation: Envelope | None = None) -> AsyncIterator[UnitOfWork]:
        """Open a transaction on a pooled connection; commit when the block ends (roll back on an exception),
        then run the on-commit callbacks."""
        async with pool.acquire() as conn:
            async with conn.transaction():
                uow = cls(conn, outbox, name=name, causation=causation, defer=True)
                yield uow
                await uow.flush()
            await uow.run_after_commit()

    async def flush(self) -> None:
        """Write the outbox rows and step outcomes kept so far (``defer``), in one statement."""
        await self.insert_pending([self])

    @staticmethod
    async def insert_pending(units: list[UnitOfWork]) -> None:
        """Write what ``units`` (all in one transaction) kept, in one statement per ``Writes`` they share."""
        seen: set[int] = set()
        for uow in units:
            if id(uow.writes) not in seen:
                seen.add(id(uow.writes))
                await uow.writes.write(uow.conn.raw)

    async def record_outcome(self, key: str, status: str, result_json: str) -> None:
        """Record a saga step's outcome under its idempotency key in this transaction: kept with the outbox
        rows when deferring (``Writes.outcome`` answers for it meanwhile), else written now."""
        if self.defer:
            self.writes.outcomes.append((key, status, result_json))
        else:
            await self.conn.execute(_RECORD_ONE, key, status, result_json)

    async def write_last(self, key: str, parts: tuple[str, ...], args: list, *, now: bool = False) -> None:
        """A statement whose result the handler does not need, written in the batch's one statement with its
        outbox rows in the consumer kit's first run of a batch (``optimistic``; should it fail there, the batch
        runs again with each handler alone, as when the handler fails), else now. ``parts``: its data-modifying
        queries (one statement's WITH queries: all see the transaction as it was before the statement, so no
        two may change one row), written with ``{0}``, ``{1}``... for ``args`` (a literal brace doubled).
        ``key`` names what it changes: a second statement for one key writes the first now, and a handler that
        reads it again first calls ``write_last_now(key)``. ``now``: write it at once all the same."""
        if key in self.writes.last:
            await self.write_last_now(key)
        if now or not (self.defer and self.optimistic):
            await self.conn.raw.execute(*one_statement([], {}, [(parts, args)]))
        else:
            self.writes.last[key] = (parts, args)

    async def write_last_now(self, key: str | None = None) -> None:
        """Write the statements kept by ``write_last`` (``key``'s, or all) now: before this transaction reads
        what they change."""
        await self.writes.write_last_now(self.conn.raw, key)

    def on_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` once this transaction has committed (never if it rolls back). A failing callback
        is logged; the work stays done (its effect is committed)."""
        self._after_commit.append(callback)

    async def run_after_commit(self) -> None:
        """Once committed: hand the outbox rows written to this process's relay (published at once, without
        a NOTIFY or a read back; should this process die first, a relay finds them in the table), then the
        callbacks."""
        rows, self._queued = self._queued, []
        if rows:
            self.outbox.hand_over(rows)
        callbacks, self._after_commit = self._after_commit, []
        for callback in callbacks:
            try:
                await callback()
            except Exception as exc:  # noqa: BLE001 - the effect is committed: never undo or retry it now
                log.error("unit_of_work.after_commit_failed", unit=self.name, error=repr(exc))

    def _correlation(self, correlation_id: str | None) -> str:
        if correlation_id is not None:
            return str(correlation_id)
        if self.causation is None:
            raise ValueError(f"{self.name}: work without a causing message must name its correlation id")
        return self.causation.correlation_id

    async def emit(self, type_: str, data: BaseModel, *, correlation_id: str | None = None,
                   tenant_id: uuid.UUID | None = None, subject_params: dict[str, str] | None = None) -> Envelope:
        """Queue one message in this transaction (published only if it commits); correlation and causation
        come from the causing message unless given."""
        [env] = await self.emit_many([(type_, data, subject_params)], correlation_id=correlation_id,
                                     tenant_id=tenant_id)
        return env

    async def emit_many(self, items: list[tuple[str, BaseModel, dict[str, str] | None]], *,
                        correlation_id: str | None = None, tenant_id: uuid.UUID | None = None) -> list[Envelope]:
        """Queue several messages (type, payload, subject params) in one round trip, in order."""
        return await self.outbox.add_many(self.conn, items, correlation_id=self._correlation(correlation_id),
                                          tenant_id=tenant_id, causation=self.causation, sink=self._queued,
                                          **({"pending": self.writes.outbox} if self.defer else {}))
