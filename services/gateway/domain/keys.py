"""API keys, request fingerprints and page cursors: small pure encodings (no I/O)."""
from __future__ import annotations

import hashlib
import json
import re
import secrets
import uuid
from datetime import UTC, datetime, timedelta

API_KEY_PREFIX = "tsk_"


def new_api_key() -> str:
    """A fresh API key, ``tsk_`` + 43 url-safe characters (256 random bits)."""
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    """What the database stores instead of the key: sha256 hex (keys are random, so no salt is needed)."""
    return hashlib.sha256(key.encode()).hexdigest()


def fingerprint(body: dict) -> str:
    """Canonical hash of a validated request body: equal bodies (key order aside) hash equal."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


class BadCursor(ValueError):
    """The cursor was not produced by ``encode_cursor``."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Every string of this form is a keyset position (a creation time in microseconds since 1970, then an id), so
# the API document can state exactly which cursors are valid.
CURSOR_PATTERN = r"^[0-9]{1,16}-[0-9a-f]{32}$"


def encode_cursor(created_at: datetime, allocation_id: uuid.UUID) -> str:
    """Keyset position: the (created_at, id) of the last item of a page, as ``<microseconds>-<id hex>``."""
    return f"{(created_at - _EPOCH) // _MICROSECOND}-{allocation_id.hex}"


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """Raises BadCursor for anything not of the form ``encode_cursor`` makes."""
    if not re.fullmatch(CURSOR_PATTERN, cursor):
        raise BadCursor("not <microseconds>-<32 hex digits>")
    micros, ident = cursor.split("-")
    return _EPOCH + int(micros) * _MICROSECOND, uuid.UUID(ident)
