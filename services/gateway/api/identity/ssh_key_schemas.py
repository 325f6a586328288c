"""HTTP models of a user's SSH public keys (like Nova's keypairs)."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar

from pydantic import Field, StringConstraints

from ...domain.ssh_keys import KEY_TYPES, MAX_KEY_CHARS, PUBLIC_KEY_PATTERN, explain_public_key
from ...http.schema_base import Body, Explained, Out, ResourceName, Text

# A key sent inline with an allocation request is at most this long (RSA up to 8192 bits with a comment), so that
# 33 of them stay within the 64 KiB a body may have; a longer key is stored (POST /v1/ssh-keys) and named.
MAX_INLINE_KEY_CHARS = 1536


def public_key(max_chars: int) -> Any:
    """The type of one OpenSSH public key line of at most ``max_chars`` characters (a 422 saying why otherwise)."""
    return Annotated[str, StringConstraints(min_length=1, max_length=max_chars), Text(),
                     Explained(PUBLIC_KEY_PATTERN, explain_public_key, "ssh_public_key"),
                     Field(description=f"One OpenSSH public key line: the type ({', '.join(KEY_TYPES)}), one space, "
                                       "the key as base64 (its blob names the same type), then optionally a space "
                                       f"and a comment. At most {max_chars} characters.")]


PublicKey = public_key(MAX_KEY_CHARS)
InlinePublicKey = public_key(MAX_INLINE_KEY_CHARS)
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
