"""Credentials' pure rules (no I/O): which signing key signs and which verify, and which issued tokens are revoked.

Signing keys: a key is a kid; its HS256 secret is HMAC-SHA256(TESSERA_TOKEN_SECRET, kid), so no key material is
stored. The current key (not retired) signs; a retired key still verifies until the last token it can have signed
has expired (retired_at + token TTL + a grace for replicas that had not heard of the rotation yet). Tokens issued
before signing keys existed carry no kid: they verify with the plain secret if issued before the first key was
made (so within one TTL of that they are all expired, and none verifies again).

Revocations: a token names its API key (``akid``) and its user (``sub``). It is refused when its key was revoked,
when its user is disabled, or when it was issued before its user's ``tokens_not_before`` (the user was disabled
then, and is enabled again since). Only what changed within the last token TTL matters: older tokens expired.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import datetime


def new_kid() -> str:
    """A fresh signing key id (public: it is in every token's header)."""
    return "k" + secrets.token_hex(8)


def signing_secret(secret: str, kid: str) -> bytes:
    """The HS256 key of signing key ``kid``: derived from the configured secret, never stored."""
    return hmac.new(secret.encode(), kid.encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class SigningKey:
    kid: str
    created_at: float                 # epoch seconds
    retired_at: float | None = None


@dataclass(frozen=True)
class Keyring:
    """The signing keys a gateway knows. ``legacy_until``: tokens without kid verify if issued before it (the first
    key's creation); None with no keys at all: no key was ever made (a process not wired to the database) and the
    plain secret both signs and verifies."""

    keys: tuple[SigningKey, ...] = ()
    legacy_until: float | None = None
    grace_s: float = 0.0

    @property
    def current(self) -> SigningKey | None:
        """The key that signs: the newest not retired (None: sign with the plain secret, without kid)."""
        live = [k for k in self.keys if k.retired_at is None]
        return max(live, key=lambda k: k.created_at) if live else None

    def verifies(self, kid: str, now: float, ttl_s: float) -> bool:
        """Whether a token signed by ``kid`` may still be accepted at ``now`` (its own expiry is checked apart)."""
        for k in self.keys:
            if k.kid == kid:
                return k.retired_at is None or now < k.retired_at + ttl_s + self.grace_s
        return False

    def accepts_legacy(self, iat: int) -> bool:
        """Whether a token without kid (signed with the plain secret) issued at ``iat`` is one of ours."""
        if self.legacy_until is None:
            return not self.keys
        return iat < self.legacy_until


@dataclass(frozen=True)
class UserRevocation:
    disabled: bool
    not_before: float | None = None   # tokens issued before this (epoch seconds) are refused


@dataclass(frozen=True)
class Revocations:
    """What a gateway refuses among tokens whose signature and expiry are fine."""

    api_keys: frozenset[str] = frozenset()
    users: dict[uuid.UUID, UserRevocation] = field(default_factory=dict)

    def refuses(self, user_id: uuid.UUID, api_key_id: str | None, iat: int) -> bool:
        if api_key_id is not None and api_key_id in self.api_keys:
            return True
        user = self.users.get(user_id)
        if user is None:
            return False
        # iat is whole seconds: a token of the second the user was disabled in counts as issued before it
        return user.disabled or (user.not_before is not None and iat < math.ceil(user.not_before))


def epoch(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None
