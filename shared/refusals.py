"""What no retry can fix: the errors a consumer refuses at once instead of retrying, and the reason it
gives for whoever sent the message (a refusal event, a failed saga step, a dead letter)."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from pydantic import ValidationError

from .unit_of_work import UnitOfWork


class PermanentError(Exception):
    """The message can never be handled (bad reference, contract breach): refuse it now, never retry it."""


Refusal = Callable[[UnitOfWork, Any, str], Awaitable[None]]   # (new unit of work, the payload, the reason)

# What no retry can fix: an explicit refusal; a payload or document that fails validation; data PostgreSQL
# refuses (class 22: NUL or an unencodable character in text, a string too long, a number out of range, bad
# text for a type...; asyncpg raises DataError too for an argument it cannot encode); a reference to a row
# that does not exist. Everything else (connection lost, serialization failure, deadlock, a unique race, a
# bug that a deploy fixes) is retried.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    PermanentError, ValidationError, asyncpg.DataError, asyncpg.ForeignKeyViolationError)


def permanent(exc: BaseException) -> bool:
    """True when retrying the message cannot help (see ``PERMANENT_ERRORS``)."""
    return isinstance(exc, PERMANENT_ERRORS)


def text_safe(text: str, limit: int = 1000) -> str:
    """``text`` as PostgreSQL text and jsonb can store it (a NUL is written ``\\x00``), at most ``limit``
    characters: a refusal's reason may quote the very input that was refused."""
    return text.replace("\x00", "\\x00")[:limit]


def refusal_reason(exc: BaseException, limit: int = 1000) -> str:
    """The reason a permanent error gives, for whoever sent the command (one line, storable)."""
    if isinstance(exc, PermanentError):
        text = str(exc)
    elif isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or e.get('type', '')}: {e['msg']}"
                             for e in exc.errors(include_url=False, include_input=False))
        text = f"invalid data ({exc.title}): {problems}"
    elif isinstance(exc, asyncpg.PostgresError):
        what = "unknown reference" if isinstance(exc, asyncpg.ForeignKeyViolationError) else "invalid data"
        detail = getattr(exc, "detail", None)
        text = f"{what} ({type(exc).__name__}): {exc}" + (f" ({detail})" if detail else "")
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text_safe(" ".join(text.split()), limit)
