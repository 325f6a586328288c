"""HTTP models of credentials: a user's API keys, disabling a user, and the token signing keys."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from ...domain.model import Role
from ...http.schema_base import Body, Out, integer, text

KEY_ID_PATTERN = r"^[0-9a-f]{16}$"
KeyName = text(63, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._@+-]*$")
KeyId = text(16, min_length=16, pattern=KEY_ID_PATTERN)
MAX_KEY_LIFETIME_S = 10 * 365 * 86400


# --- requests ---------------------------------------------------------------------------------------

class ApiKeyCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"id", "user_id", "api_key", "created_at", "created_by",
                                                        "revoked_at", "last_used_at", "state",
                                                        "expires_at"})
    name: KeyName = Field(description="What the key is for (a laptop, a CI job); need not be unique.")
    expires_in_s: integer(1, MAX_KEY_LIFETIME_S) | None = Field(
        default=None, description="Seconds from now until the key expires (at most ten years): after that it obtains "
                                  "no token, and no token it obtained outlives it. None: no expiry.")

class UserPatch(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"id", "tenant_id", "name", "role", "created_at",
                                                        "disabled_at"})
    disabled: bool = Field(description="true: the user obtains no token and the tokens it holds stop working at "
                                       "once; false: it may sign in again (its earlier tokens stay refused).")


# --- responses --------------------------------------------------------------------------------------

class ApiKeyOut(Out):
    """One of a user's API keys (never the key itself: only its hash is stored)."""

    id: str = Field(description="The key's public id: the tokens it obtains name it (claim `akid`), and so does "
                                "the audit trail.")
    user_id: uuid.UUID
    name: str
    state: Literal["active", "expired", "revoked"]
    created_at: datetime
    created_by: uuid.UUID | None
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None = Field(description="When it last obtained a token.")


class ApiKeyCreatedOut(ApiKeyOut):
    """The new key, with the key itself (shown this once)."""

    api_key: str = Field(description="Shown once; only its hash is stored.")


class ApiKeyList(Out):
    """The user's keys, newest first (revoked and expired ones too), at most 100."""

    items: list[ApiKeyOut]


class UserStateOut(Out):
    """A tenant's user and whether it is disabled."""

    id: uuid.UUID
    tenant_id: uuid.UUID | None
    name: str
    role: Role
    created_at: datetime
    disabled: bool
    disabled_at: datetime | None


class SigningKeyOut(Out):
    """A token signing key (its id and times; the key itself is derived, never stored nor shown)."""

    kid: str
    current: bool = Field(description="The key new tokens are signed with.")
    created_at: datetime
    retired_at: datetime | None
    verifies_until: datetime | None = Field(description="A retired key's tokens are accepted until then (the last "
                                                        "one it signed has expired by then).")


class SigningKeyList(Out):
    """The current signing key and those whose tokens may still be in use, newest first."""

    items: list[SigningKeyOut]
