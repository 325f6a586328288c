"""HTTP models of a user's SSH public keys (like Nova's keypairs)."""
from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import Field

from ...domain.ssh_keys import MAX_KEY_CHARS
from ...http.schema_base import Body, Out, ResourceName
from ...http.schema_types import public_key

PublicKey = public_key(MAX_KEY_CHARS)
KeyName = ResourceName


class SshKeyCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"fingerprint", "type", "comment", "created_at", "user_id"})
    name: KeyName
    public_key: PublicKey


class SshKeyOut(Out):
    """One of the caller's SSH public keys."""

    name: str
    type: str
    fingerprint: str = Field(description="SHA256:<base64 of the key blob's SHA-256, unpadded>, as ssh-keygen -l shows it.")
    public_key: str
    comment: str
    created_at: datetime


class SshKeyList(Out):
    """The caller's SSH public keys, by name."""

    items: list[SshKeyOut]
