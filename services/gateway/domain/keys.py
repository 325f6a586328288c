"""API keys, request fingerprints and page cursors: small pure encodings (no I/O)."""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import uuid
from datetime import datetime

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


def encode_cursor(created_at: datetime, allocation_id: uuid.UUID) -> str:
    """Opaque keyset position: the (created_at, id) of the last item of a page."""
    raw = json.dumps([created_at.isoformat(), str(allocation_id)], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """Raises BadCursor for anything ``encode_cursor`` did not make."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, ident = json.loads(raw)
        created_at = datetime.fromisoformat(at)
        if created_at.tzinfo is None:
            raise ValueError("naive timestamp")
        return created_at, uuid.UUID(ident)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise BadCursor(str(exc)) from None
