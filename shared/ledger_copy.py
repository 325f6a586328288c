"""The fast way of shared/ledger_walk.py's walk: the rows as the raw bytes of ``COPY (SELECT * …) TO STDOUT``
(text format: nothing is decoded into driver records), cut at line ends into slices of about SLICE_BYTES, each
checked by shared.chain_text.check — in a pool of worker processes (one per CPU) for a chain of at least
POOL_MIN_ROWS rows, in this process for a shorter one (a pool costs more than it saves there). This process
checks what no slice can: the link and seq between one slice's last row and the next one's first, and the
checkpoints (their Merkle trees, from the leaf hashes the slices return when there are checkpoints).
Slices are judged in order, so findings are those of the record walk, in the same order.

``walk_copy`` returns False, having left ``result`` and the trees as they were, when a value is outside what
shared.chain_text decodes (or a slice fails in any way): the caller then walks the records.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import gc
import multiprocessing
import os
from typing import Any

import asyncpg

from shared.chain_text import check

SLICE_BYTES = 1 << 20      # COPY text a slice (about 3,000 ledger rows): big enough that handing it over is cheap
POOL_MIN_ROWS = 50_000     # a shorter chain is checked in this process (starting workers would cost more)
_SETTINGS = {"TimeZone": "UTC", "DateStyle": "ISO, MDY", "bytea_output": "hex"}


def workers() -> int:
    """The CPUs this process may run on (its affinity, where the system has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _pool() -> concurrent.futures.ProcessPoolExecutor:
    # fork: a worker needs nothing but shared.chain_text, already imported here; spawn/forkserver would import
    # the caller's __main__ again in each worker, longer than many a verify. A forked worker freezes what it
    # inherits (gc.freeze): the collector never finalizes the parent's objects (its connections) there, and a
    # worker leaves by os._exit, without running the parent's exit handlers.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    return concurrent.futures.ProcessPoolExecutor(workers(), mp_context=context, initializer=gc.freeze)


async def walk_copy(conn: asyncpg.Connection, table: str, columns: tuple[tuple[str, str], ...],
                    judge: Any, keep: bool, limit: int) -> bool:
    """Stream ``table`` (quoted) in seq order as COPY text and hand each slice's ``Checked`` to ``judge``
    (``judge(checked)``, in row order). ``keep``: the slices return every seq and leaf hash. Must run
    inside a transaction (the settings the text relies on are set for it, and put back after)."""
    last = await conn.fetchval(f"SELECT max(seq) FROM {table}")
    pool = _pool() if last is not None and last >= POOL_MIN_ROWS and workers() > 1 else None
    old = await conn.fetchrow("SELECT " + ", ".join(f"current_setting('{k}') AS \"{k}\"" for k in _SETTINGS))
    await _set(conn, _SETTINGS)
    try:
        stream = _Stream(columns, judge, keep, limit, pool)
        await conn.copy_from_query(f"SELECT * FROM {table} ORDER BY seq", output=stream.take)
        await stream.finish()
        await _set(conn, dict(old))   # (on an error the transaction or savepoint rolls back, settings too)
        return stream.failed is None
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


async def _set(conn: asyncpg.Connection, settings: dict[str, str]) -> None:
    names = list(settings)
    await conn.execute("SELECT " + ", ".join(f"set_config(${2 * i + 1}, ${2 * i + 2}, true)"
                                             for i in range(len(names))),
                       *[v for k in names for v in (k, settings[k])])


class _Stream:
    """The COPY output's sink: whole lines cut into slices, checked (in the pool, at most two slices a worker
    ahead of the judging) and judged in order. After a failure the rest of the output is only drained: the
    COPY must end normally for the connection to stay usable."""

    def __init__(self, columns, judge, keep: bool, limit: int, pool):
        self.columns, self.judge, self.keep, self.limit, self.pool = columns, judge, keep, limit, pool
        self.parts: list[bytes] = []    # the output since the last slice (it ends within the last part)
        self.size = 0
        self.pending: collections.deque[asyncio.Future] = collections.deque()
        self.ahead = 2 * workers()
        self.failed: BaseException | None = None

    async def take(self, data: bytes) -> None:
        if self.failed is not None:
            return
        self.parts.append(data)
        self.size += len(data)
        if self.size >= SLICE_BYTES and (end := data.rfind(b"\n") + 1):
            # one copy into the slice: the parts before, and this one up to its last line end
            self.parts[-1] = data[:end]
            piece = b"".join(self.parts)
            self.parts = [data[end:]] if end < len(data) else []
            self.size = len(data) - end
            await self._submit(piece)

    async def finish(self) -> None:
        if self.failed is None and self.parts:
            await self._submit(b"".join(self.parts))
        while self.pending and self.failed is None:
            await self._judge_oldest()
        for future in self.pending:
            future.cancel()

    async def _submit(self, piece: bytes) -> None:
        if self.pool is None:
            try:
                checked = check(self.columns, piece, self.limit, self.keep)
            except Exception as e:    # Unsupported, or anything else: the record walk will say what
                self.failed = e
                return
            self.judge(checked)
            return
        loop = asyncio.get_running_loop()
        self.pending.append(loop.run_in_executor(self.pool, check, self.columns, piece, self.limit, self.keep))
        while self.failed is None and self.pending and (len(self.pending) > self.ahead or self.pending[0].done()):
            await self._judge_oldest()

    async def _judge_oldest(self) -> None:
        future = self.pending.popleft()
        try:
            checked = await future
        except Exception as e:    # as in _submit; a broken pool too
            self.failed = e
            return
        self.judge(checked)
