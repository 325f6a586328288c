"""Token signing keys (provider admins): list them, rotate now. Automatic rotation (entrypoints/credentials.py,
every TESSERA_TOKEN_KEY_ROTATE_S) goes through the same ``rotate``.

A rotation makes a new current key (new tokens carry its kid) and retires the previous one, whose tokens are
accepted until they expire (retired_at + token TTL + the replicas' reload period). It emits
``gateway.credential_revoked`` kind ``signing_key`` so every replica reloads its keys at once (a replica meeting
a kid it does not know reloads anyway).
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from aiohttp import web

from ...adapters import identity
from ...contracts import CredentialRevoked
from ...domain.credentials import new_kid
from ...http.auth import require_provider_admin
from ...http.endpoint import Endpoint, respond
from ...http.state import Gateway, gateway_of
from .api_key_schemas import SigningKeyList, SigningKeyOut


async def rotate(gw: Gateway, by: uuid.UUID | None, *, older_than_s: float | None = None) -> str | None:
    """Make a new current signing key; its kid. ``older_than_s``: only if the current one is older than that (or
    none exists), else None and nothing changes. Safe for replicas doing it together."""
    kid = new_kid()
    async with gw.unit_of_work("gateway.rotate_signing_key") as uow:
        if not await identity.rotate_signing_key(uow.conn, kid, older_than_s=older_than_s):
            return None
        await uow.emit("gateway.credential_revoked", CredentialRevoked(
            kind="signing_key", key_id=kid, by=by, at=datetime.now(UTC)), correlation_id=f"signing-key:{kid}")
    gw.tokens.cache.invalidate()   # this replica at once; the others when the event reaches them
    return kid


async def _listed(gw: Gateway) -> SigningKeyList:
    ttl = timedelta(seconds=gw.config.token_ttl_s + gw.config.credentials_refresh_s)
    async with gw.pool.acquire() as conn:
        rows, _ = await identity.signing_keys(conn, ttl.total_seconds())
    return SigningKeyList(items=[
        SigningKeyOut(kid=r["kid"], current=r["retired_at"] is None, created_at=r["created_at"],
                      retired_at=r["retired_at"], verifies_until=r["retired_at"] + ttl if r["retired_at"] else None)
        for r in reversed(rows)])


async def list_signing_keys(request: web.Request) -> web.Response:
    require_provider_admin(request)
    return respond(await _listed(gateway_of(request)))


async def rotate_signing_key(request: web.Request) -> web.Response:
    admin = require_provider_admin(request)
    gw = gateway_of(request)
    await rotate(gw, admin.user_id)
    return respond(await _listed(gw))


ENDPOINTS = [
    Endpoint("GET", "/v1/ops/signing-keys", list_signing_keys, "listSigningKeys",
             "List the token signing keys in use (provider admin)", "ops", {200: SigningKeyList}, errors=(401, 403),
             description="The current key (new tokens carry its kid) and the retired ones whose tokens may still be "
                         "in use; no key material (a key is derived from TESSERA_TOKEN_SECRET and its kid)."),
    Endpoint("POST", "/v1/ops/signing-keys/rotate", rotate_signing_key, "rotateSigningKey",
             "Rotate the token signing key now (provider admin)", "ops", {200: SigningKeyList}, errors=(401, 403),
             description="New tokens are signed with a new key; tokens of the previous one keep working until they "
                         "expire. Also done every TESSERA_TOKEN_KEY_ROTATE_S seconds (docs/credentials.md)."),
]
