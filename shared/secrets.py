"""Secrets sealed at rest and on the bus: AES-256-GCM with the platform's secret key.

The key is 32 random bytes, base64 (urlsafe) encoded, from ``TESSERA_SECRET_KEY`` or the file named by
``TESSERA_SECRET_KEY_FILE`` (the embedded runner generates one into its data folder, mode 0600; Kubernetes
mounts it from a Secret). A sealed value is ``v1.<base64 nonce + ciphertext + tag>``: tampering with it, or
unsealing with another key, raises ``SecretError``. The additional data binds a value to its purpose
(e.g. ``bmc:<node id>``), so a sealed BMC password cannot be replayed as another node's.
"""
from __future__ import annotations

import base64
import os
import secrets as _random
from collections.abc import Mapping
from pathlib import Path

KEY_VAR = "TESSERA_SECRET_KEY"
KEY_FILE_VAR = "TESSERA_SECRET_KEY_FILE"
_PREFIX = "v1."


class SecretError(ValueError):
    """No usable key, or a sealed value that does not open with it."""


def new_key() -> str:
    return base64.urlsafe_b64encode(_random.token_bytes(32)).decode()


def parse_key(text: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text.strip().encode())
    except (ValueError, TypeError):
        key = b""
    if len(key) != 32:
        raise SecretError(f"{KEY_VAR}: expected 32 bytes, base64 encoded (e.g. from shared.secrets.new_key())")
    return key


def key_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The platform's key, or None when neither variable is set; raises SecretError for a bad one."""
    environ = os.environ if environ is None else environ
    if environ.get(KEY_VAR):
        return parse_key(environ[KEY_VAR])
    if environ.get(KEY_FILE_VAR):
        try:
            return parse_key(Path(environ[KEY_FILE_VAR]).read_text())
        except OSError as exc:
            raise SecretError(f"{KEY_FILE_VAR}={environ[KEY_FILE_VAR]!r}: {exc.strerror}") from None
    return None


def ensure_key_file(path: Path) -> Path:
    """Create the key file (mode 0600) unless it exists; returns its path."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(new_key())
    return path


def _aead(key: bytes):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    return AESGCM(key)


def seal(plaintext: str, key: bytes, purpose: str) -> str:
    nonce = _random.token_bytes(12)
    sealed = _aead(key).encrypt(nonce, plaintext.encode(), purpose.encode())
    return _PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()


def unseal(token: str, key: bytes, purpose: str) -> str:
    from cryptography.exceptions import InvalidTag
    if not token.startswith(_PREFIX):
        raise SecretError("not a sealed value")
    try:
        raw = base64.urlsafe_b64decode(token[len(_PREFIX):].encode())
        return _aead(key).decrypt(raw[:12], raw[12:], purpose.encode()).decode()
    except (InvalidTag, ValueError) as exc:
        raise SecretError("the sealed value does not open with this key (another key, or altered)") from exc
