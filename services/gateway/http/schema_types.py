"""Field types the models of several slices name: an OpenSSH public key line (a stored key's, and one sent inline
with an allocation), a storage class's name and a volume's attachment mode (a volume's, and an allocation's)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from services.storage.contracts import CLASS_NAME_PATTERN

from ..domain.ssh_keys import KEY_TYPES, PUBLIC_KEY_PATTERN, explain_public_key
from .schema_base import Explained, Text, text

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


StorageClassName = text(32, min_length=1, pattern=CLASS_NAME_PATTERN)
Mode = Literal["rw", "ro"]
