"""The signing keys and revocation list one gateway process holds in memory, for the bearer check of every request.

Loaded from the database (``load``: injected at start, see entrypoints/credentials.py) and reloaded on the next
request after either of: a ``gateway.credential_revoked`` event (every replica hears it on a plain NATS
subscription and calls ``invalidate``), or ``refresh_s`` seconds (the safety net for an event that was missed). A
request therefore meets a revocation within the event's propagation on every replica, and at worst after
``refresh_s``. Reloads are single-flight: concurrent requests wait for one query, not one each.

If the database cannot be read, the last lists stay in use (and the next request retries after a second): the
gateway keeps serving on slightly stale revocations rather than refusing everyone.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from ..domain.credentials import Keyring, Revocations

log = structlog.get_logger()
Loader = Callable[[], Awaitable[tuple[Keyring, Revocations]]]
RETRY_S = 1.0
LOAD_TIMEOUT_S = 5.0


class CredentialCache:
    def __init__(self, refresh_s: float = 5.0):
        self.refresh_s = refresh_s
        self.keyring = Keyring()            # until loaded: the plain secret signs and verifies (no database)
        self.revocations = Revocations()
        self._load: Loader | None = None
        self._lock: asyncio.Lock | None = None
        self._loaded_at = float("-inf")     # monotonic time the last load started
        self._generation = 0                # bumped by invalidate; a load in flight meanwhile does not count
        self._loaded_generation = -1

    def attach(self, load: Loader) -> None:
        """Read the lists with ``load`` from now on (the next request loads them)."""
        self._load, self._lock = load, asyncio.Lock()
        self.invalidate()

    def invalidate(self) -> None:
        """A credential changed somewhere: the next request reloads (cheap; safe from any callback)."""
        self._generation += 1

    @property
    def stale(self) -> bool:
        return (self._loaded_generation != self._generation
                or time.monotonic() - self._loaded_at >= self.refresh_s)

    async def fresh(self) -> None:
        """Make sure the lists are current (a reload when stale); never raises for a failed read."""
        if self._load is not None and self.stale:
            await self.reload(only_if_stale=True)

    async def reload(self, *, only_if_stale: bool = False) -> None:
        """Load now, single-flight: callers that queued behind a load which started after they asked take its
        result instead of loading again (so a burst of tokens of a key this replica has not heard of yet costs
        one query). ``only_if_stale``: not if the lists became current meanwhile."""
        if self._load is None or self._lock is None:
            return
        asked = time.monotonic()
        async with self._lock:
            if self._loaded_generation == self._generation and (
                    self._loaded_at >= asked or (only_if_stale and not self.stale)):
                return
            started, generation = time.monotonic(), self._generation
            try:
                async with asyncio.timeout(LOAD_TIMEOUT_S):
                    self.keyring, self.revocations = await self._load()
            except Exception as exc:   # keep the last lists; try again in a second
                log.warning("gateway.credentials_reload_failed", error=repr(exc))
                self._loaded_at, self._loaded_generation = started - self.refresh_s + RETRY_S, generation
                return
            self._loaded_at, self._loaded_generation = started, generation
