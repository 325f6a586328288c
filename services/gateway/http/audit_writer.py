"""Appends to the audit chain, group-committed: the records of requests that finish while an append is in flight
are appended together by the next one (shared.ledger_store.append_many: one lock, one head read, one INSERT and
one commit for all of them), so concurrent mutations share the five round trips an append costs.

Nothing waits for company: a record arriving when no append is in flight is written at once, alone. Each caller
still returns only once its own record is committed (or has failed), so the audit middleware's rule holds: no
success is answered before its record is on the chain. A batch that fails is retried one record at a time, so a
record that cannot be written fails alone, as it would have unbatched; the retries are idempotent by ``audit_id``
(a batch whose commit was acknowledged late is not written twice). A caller cancelled while waiting leaves its
record in the batch: it is written all the same (a request stopped mid-way is recorded, as before)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg

from shared import ledger_store

MAX_BATCH = 64   # records appended together at most (one INSERT; a larger backlog takes several appends)


class AuditWriter:
    def __init__(self, pool: Callable[[], asyncpg.Pool], table: str):
        self.pool, self.table = pool, table
        self._pending: list[tuple[dict, asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None

    async def append(self, entry: dict) -> None:
        """Append ``entry`` to the chain; returns once it is committed. Raises whatever its append raised."""
        done = asyncio.get_running_loop().create_future()
        done.add_done_callback(_retrieved)   # a cancelled caller's failure is not "never retrieved"
        self._pending.append((entry, done))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        await asyncio.shield(done)

    async def _drain(self) -> None:
        batch: list[tuple[dict, asyncio.Future]] = []
        try:
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                await self._append(batch)
        except BaseException as exc:   # stopped (the process is shutting down): no caller is left waiting
            for _, done in batch + self._pending:
                _settle(done, exc)
            self._pending = []
            raise

    async def _append(self, batch: list[tuple[dict, asyncio.Future]]) -> None:
        try:
            await self._write([entry for entry, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0][1], exc)
                return
            for entry, done in batch:    # alone, so only a record that cannot be written fails
                try:
                    await self._write([entry], unique="audit_id")
                except Exception as one:
                    _settle(done, one)
                else:
                    _settle(done, None)
            return
        for _, done in batch:
            _settle(done, None)

    async def _write(self, entries: list[dict], unique: str | None = None) -> None:
        async with self.pool().acquire() as conn:   # append_many's own transaction (not a savepoint in another)
            await ledger_store.append_many(conn, self.table, entries, unique=unique)


def _settle(done: asyncio.Future, exc: BaseException | None) -> None:
    if done.done():
        return
    if exc is None:
        done.set_result(None)
    else:
        done.set_exception(exc)


def _retrieved(done: asyncio.Future) -> None:
    if not done.cancelled():
        done.exception()
