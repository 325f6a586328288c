"""Keyset pages, newest first, as every list of the API pages them: ``?limit=`` and ``?cursor=`` (the
``next_cursor`` of the previous page, the position of its last item)."""
from __future__ import annotations

from collections.abc import Awaitable, Callable

import asyncpg
from aiohttp import web

from ..adapters.keyset import Position
from ..domain.keys import CURSOR_PATTERN, BadCursor, decode_cursor, encode_cursor
from .endpoint import Param
from .inputs import query_value
from .problems import validation_problem
from .schema_base import FieldError, integer, text
from .state import gateway_of

LIMIT = Param("limit", "query", "Page size.", integer(1, 100), default=20)
CURSOR = Param("cursor", "query", "The next_cursor of the previous page.", text(49, min_length=34, pattern=CURSOR_PATTERN))


def position(request: web.Request) -> Position | None:
    """Where the page starts: after the ``cursor`` position (None: at the newest); 422 for a cursor this API
    did not return."""
    raw = query_value(request, CURSOR)
    if raw is None:
        return None
    try:
        return decode_cursor(raw)
    except BadCursor:
        raise validation_problem([FieldError(field="cursor", message="not a cursor this API returned", code="query")]) from None


def page(rows: list, limit: int, created: str = "created_at") -> tuple[list, str | None]:
    """The page (``rows`` fetched with ``limit + 1``) and the cursor of the next one (None: the last page)."""
    items = rows[:limit]
    if len(rows) <= limit:
        return items, None
    return items, encode_cursor(items[-1][created], items[-1]["id"])


async def read_page(request: web.Request, fetch: Callable[[asyncpg.Connection, int, Position | None], Awaitable[list]],
                    created: str = "created_at") -> tuple[list, str | None]:
    """The page the request's ``?limit=`` and ``?cursor=`` ask for (both checked first, a 422 for a bad one), and
    the cursor of the next (None: the last page): ``fetch(conn, n, after)`` reads up to ``n`` rows (one more
    than the page, to tell whether another follows) older than ``after`` on a pooled connection."""
    limit, after = query_value(request, LIMIT), position(request)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await fetch(conn, limit + 1, after)
    return page(rows, limit, created)
