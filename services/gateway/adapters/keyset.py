"""Keyset pages in SQL: the rows of a query newest first by (time, id), strictly older than a position (the
position of the previous page's last row), as the API's ``?cursor=`` pages them."""
from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import asyncpg

Position = tuple[datetime, uuid.UUID]


async def newest_first(conn: asyncpg.Connection, select: str, args: Sequence, limit: int, after: Position | None,
                       *, time: str = "created_at", key: str = "id") -> list[asyncpg.Record]:
    """Up to ``limit`` rows of ``select`` (``SELECT ... WHERE <condition>``, its parameters ``args`` from $1),
    ordered by ``time`` then ``key``, newest first, each strictly older than ``after`` (None: from the newest).
    ``time`` and ``key`` are the caller's column names, never client input; an index on ``(time DESC, key
    DESC)`` serves the query."""
    args = list(args)
    if after is not None:
        args += [after[0], after[1]]
        select = f"{select} AND ({time}, {key}) < (${len(args) - 1}, ${len(args)})"
    return await conn.fetch(f"{select} ORDER BY {time} DESC, {key} DESC LIMIT ${len(args) + 1}", *args, limit)
