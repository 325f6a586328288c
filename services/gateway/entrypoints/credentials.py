"""At start, for the life of the process: a current signing key exists, this process's credential cache
(http/credentials.py) reads signing keys and revocations from the database, every ``gateway.credential_revoked``
event invalidates it, and the signing key rotates every TESSERA_TOKEN_KEY_ROTATE_S seconds.

The event is heard through Runtime.listen (a plain core-NATS subscription, not a durable consumer): every replica must see
every event (a durable consumer would hand each event to one of them). A missed event (this replica disconnected
meanwhile) costs at most ``credentials_refresh_s``: the cache reloads that often anyway.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from ..adapters import identity
from ..api.identity.signing_keys import rotate
from ..domain.credentials import Keyring, Revocations, SigningKey, UserRevocation, epoch
from ..http.state import GATEWAY, Gateway

log = structlog.get_logger()
REVOKED = "gateway.credential_revoked"


def on_revoked(gw: Gateway):
    """The listener of REVOKED (Runtime.listen: every replica hears each one): the next request reloads."""
    async def drop(_msg) -> None:
        gw.tokens.cache.invalidate()
    return drop
ONLY_IF_NONE = 1e9   # seconds no key is ever old: at start, rotate only when there is no key yet


def loader(gw: Gateway):
    """The cache's load: signing keys and revocations of the last token TTL (plus the reload period)."""
    cfg = gw.config
    window = cfg.token_ttl_s + cfg.credentials_refresh_s

    async def load() -> tuple[Keyring, Revocations]:
        async with gw.pool.acquire() as conn:
            keys, first = await identity.signing_keys(conn, window)
            revoked_keys, users = await identity.recent_revocations(conn, window)
        ring = tuple(SigningKey(r["kid"], r["created_at"].timestamp(), epoch(r["retired_at"])) for r in keys)
        keyring = Keyring(ring, epoch(first), grace_s=cfg.credentials_refresh_s)
        revocations = Revocations(frozenset(revoked_keys), {
            r["id"]: UserRevocation(r["disabled"], epoch(r["tokens_not_before"])) for r in users})
        return keyring, revocations
    return load


async def _rotate_when_due(gw: Gateway, every_s: int) -> None:
    while True:
        await asyncio.sleep(max(min(every_s / 4, 60.0), 0.2))
        try:
            kid = await rotate(gw, None, older_than_s=every_s)
        except Exception as exc:   # the database is away: try again next round
            log.warning("gateway.signing_key_rotation_failed", error=repr(exc))
            continue
        if kid:
            log.info("gateway.signing_key_rotated", kid=kid)


async def credential_state(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx of the gateway's app (entrypoints/http.py)."""
    gw = app[GATEWAY]
    cache = gw.tokens.cache
    cache.refresh_s = gw.config.credentials_refresh_s
    every = gw.config.token_key_rotate_s
    await rotate(gw, None, older_than_s=every or ONLY_IF_NONE)
    cache.attach(loader(gw))
    await cache.reload()

    rotating = asyncio.create_task(_rotate_when_due(gw, every)) if every else None
    try:
        yield
    finally:
        if rotating is not None:
            rotating.cancel()
            with contextlib.suppress(BaseException):
                await rotating

