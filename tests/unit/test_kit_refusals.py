"""The consumer kit's classification of handler errors: what no retry can fix (refused at once) and what may
succeed on a retry, and the reason a refusal gives (one line, storable in PostgreSQL text and jsonb)."""
from __future__ import annotations

import asyncpg
import pytest
from pydantic import BaseModel, Field, ValidationError

from shared.refusals import PermanentError, permanent, refusal_reason, text_safe


class Item(BaseModel):
    count: int = Field(ge=0)


def validation_error() -> ValidationError:
    try:
        Item(count=-1)
    except ValidationError as exc:
        return exc
    raise AssertionError("Item(count=-1) validated")


@pytest.mark.parametrize("exc", [
    PermanentError("no such allocation"), validation_error(),
    asyncpg.CharacterNotInRepertoireError('invalid byte sequence for encoding "UTF8": 0x00'),
    asyncpg.UntranslatableCharacterError("unsupported Unicode escape sequence"),
    asyncpg.StringDataRightTruncationError("value too long for type character varying(63)"),
    asyncpg.NumericValueOutOfRangeError("integer out of range"),
    asyncpg.InvalidTextRepresentationError('invalid input syntax for type integer: "x"'),
    asyncpg.DataError("invalid input for query argument $1"), asyncpg.DivisionByZeroError("division by zero"),
    asyncpg.ForeignKeyViolationError('violates foreign key constraint "slots_node_id_fkey"'),
])
def test_errors_no_retry_can_fix_are_permanent(exc):
    assert permanent(exc)


@pytest.mark.parametrize("exc", [
    ConnectionError("lost"), TimeoutError(), RuntimeError("a bug a deploy fixes"), ValueError("not a validation"),
    asyncpg.SerializationError("could not serialize access"), asyncpg.DeadlockDetectedError("deadlock detected"),
    asyncpg.UniqueViolationError("duplicate key value"), asyncpg.InterfaceError("connection is closed"),
    asyncpg.CannotConnectNowError("the database system is starting up"),
])
def test_errors_a_retry_may_fix_are_not_permanent(exc):
    assert not permanent(exc)


def test_a_refusal_reason_is_one_storable_line_naming_what_was_wrong():
    data = refusal_reason(asyncpg.CharacterNotInRepertoireError('invalid byte sequence for encoding "UTF8": 0x00'))
    assert data == 'invalid data (CharacterNotInRepertoireError): invalid byte sequence for encoding "UTF8": 0x00'
    assert refusal_reason(validation_error()).startswith("invalid data (Item): count: Input should be greater")
    assert refusal_reason(asyncpg.ForeignKeyViolationError("fk")).startswith("unknown reference (ForeignKeyViolation")
    quoted = refusal_reason(PermanentError("name 'a\x00b'\nis refused " + "x" * 5000))
    assert "\x00" not in quoted and "\n" not in quoted and quoted.startswith("name 'a\\x00b' is refused")
    assert len(quoted) == 1000
    assert text_safe("a\x00b") == "a\\x00b"
