"""OpenSSH public keys, as a user uploads them (``authorized_keys`` lines, like Nova's keypairs): parsing,
the rule as one regular expression, and the SHA-256 fingerprint ``ssh-keygen -l`` prints (pure, no I/O).

A key is one line ``<type> <base64 blob> [comment]``. The blob is SSH wire format: it starts with the key
type as an SSH string (a big-endian uint32 length, then the type's bytes), and something follows it. The
regular expression ``PUBLIC_KEY_PATTERN`` states exactly that (the base64 of the type's SSH string is fixed,
so it is spelled out per type), which lets the API document say what the server accepts.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from dataclasses import dataclass

KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
             "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
MAX_KEY_CHARS = 16 * 1024
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_ANY = "[A-Za-z0-9+/]"
_COMMENT = r"(?: [^\u0000-\u001f\u007f-\u009f]*)?"


class BadKey(ValueError):
    """The text is not an OpenSSH public key this API accepts (the message says why)."""


@dataclass(frozen=True)
class PublicKey:
    type: str
    blob: bytes
    comment: str

    @property
    def fingerprint(self) -> str:
        """``SHA256:<base64 of sha256(blob), unpadded>``, as ``ssh-keygen -l`` shows it."""
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.blob).digest()).decode().rstrip("=")


def _ssh_string(value: str) -> bytes:
    return struct.pack(">I", len(value)) + value.encode()


def _literal(text: str) -> str:
    """``text`` as a pattern that ECMA-262 (unicode mode) and Python read alike: only syntax characters are
    escaped (``re.escape`` also escapes '-', an error outside a class in unicode mode)."""
    return re.sub(r"([.+*?()\[\]{}|^$\\])", r"\\\1", text)


def _blob_pattern(key_type: str) -> str:
    """Base64 whose decoded bytes start with ``key_type`` as an SSH string and go on (at least one byte more)."""
    prefix = _ssh_string(key_type)
    whole, rest = divmod(len(prefix), 3)
    fixed = _literal(base64.b64encode(prefix[: whole * 3]).decode())
    tail = f"(?:{_ANY}{{4}})*(?:{_ANY}{{3}}=|{_ANY}{{2}}==)?"
    if rest == 0:       # the next quartet is the key's own: at least one byte of it
        return fixed + f"(?:{_ANY}{{4}})*(?:{_ANY}{{4}}|{_ANY}{{3}}=|{_ANY}{{2}}==)"
    if rest == 1:       # one fixed byte: its first character, then the 4 high bits of the second are free
        b = prefix[-1]
        first, second = _B64[b >> 2], _B64[(b & 3) << 4: ((b & 3) << 4) + 16]
        return fixed + f"{_literal(first)}[{second}](?:{_ANY}=|{_ANY}{{2}}{tail})"
    b1, b2 = prefix[-2], prefix[-1]  # two fixed bytes: two characters, then 4 bits of a third are fixed
    chars = _B64[b1 >> 2] + _B64[((b1 & 3) << 4) | (b2 >> 4)]
    third = _B64[(b2 & 15) << 2: ((b2 & 15) << 2) + 4]
    return fixed + f"{_literal(chars)}[{third}]{_ANY}{tail}"


PUBLIC_KEY_PATTERN = ("^(?:" + "|".join(f"{_literal(t)} {_blob_pattern(t)}" for t in KEY_TYPES) + ")"
                      + _COMMENT + "$")


def parse_public_key(line: str) -> PublicKey:
    """The key of one ``authorized_keys`` line. Raises BadKey saying what is wrong."""
    if len(line) > MAX_KEY_CHARS:
        raise BadKey(f"a public key has at most {MAX_KEY_CHARS} characters")
    if "\n" in line or "\r" in line:
        raise BadKey("a public key is one line")
    key_type, _, rest = line.partition(" ")
    if key_type not in KEY_TYPES:
        raise BadKey(f"the key type must be one of {', '.join(KEY_TYPES)}")
    encoded, _, comment = rest.partition(" ")
    try:
        blob = base64.b64decode(encoded, validate=True) if len(encoded) % 4 == 0 else None
    except (binascii.Error, ValueError):
        blob = None
    if not blob:
        raise BadKey("after the key type and one space comes the key as base64")
    expected = _ssh_string(key_type)
    if not blob.startswith(expected) or len(blob) <= len(expected):
        raise BadKey(f"the base64 key is not a {key_type} key (its blob names another type)")
    if re.search(r"[\u0000-\u001f\u007f-\u009f]", comment):
        raise BadKey("the comment must not contain control characters")
    return PublicKey(key_type, blob, comment)


def explain_public_key(line: str) -> str | None:
    """Why ``line`` is refused, or None when it is a valid key (for ``http.schema_base.Explained``)."""
    try:
        parse_public_key(line)
    except BadKey as exc:
        return str(exc)
    return None
