"""Server-sent events: the wire format, and the hub that wakes allocation streams on NOTIFY.

One LISTEN connection per process receives the projection's NOTIFY (payload: the
allocation id) and sets the wake-up event of each stream watching that allocation.
Streams also re-read on a timer, so a lost notification (listener reconnecting)
delays an event, never drops it.

A tenant's open streams are bounded across replicas (``tenant_stream``): each holds a lease row in PostgreSQL,
renewed while it is open and deleted when it ends; a replica that dies leaves leases that expire.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator

import asyncpg
import structlog
from aiohttp import web

from ..adapters import rate_limits as leases
from .problems import ProblemError

log = structlog.get_logger()

KEEPALIVE = b": keepalive\n\n"


def event_bytes(event_id: str, event: str, data: str) -> bytes:
    """One SSE event; ``data`` must be a single line (compact JSON is)."""
    return f"id: {event_id}\nevent: {event}\ndata: {data}\n\n".encode()


def json_line(value) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    return resp


class StreamRegistry:
    """Open streams, ended cleanly at shutdown (a stream never ends on its own).

    Each stream registers how to wake itself; ``close_all`` (an on_shutdown hook) sets
    ``closing`` and wakes them all, so they finish their response instead of holding
    the server's shutdown for its full timeout.
    """

    def __init__(self) -> None:
        self.closing = asyncio.Event()
        self._wakers: set[Callable[[], None]] = set()

    @contextlib.contextmanager
    def track(self, wake: Callable[[], None]) -> Iterator[None]:
        self._wakers.add(wake)
        try:
            yield
        finally:
            self._wakers.discard(wake)

    async def close_all(self, _app: web.Application | None = None) -> None:
        self.closing.set()
        for wake in list(self._wakers):
            wake()

    def __len__(self) -> int:
        return len(self._wakers)


class AllocationEventHub:
    """Fans the projection's NOTIFY out to the streams watching each allocation, and to the feeds watching them
    all (``watch_any``)."""

    def __init__(self, channel: str):
        self.channel = channel
        self._watchers: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._any: set[asyncio.Event] = set()

    def _notified(self, _conn, _pid, _channel, payload: str) -> None:
        for wake in self._watchers.get(payload, ()):
            wake.set()
        for wake in self._any:
            wake.set()

    @contextlib.contextmanager
    def watch_any(self) -> Iterator[asyncio.Event]:
        """An event set whenever new events of any allocation are committed (the feed filters what it reads)."""
        wake = asyncio.Event()
        self._any.add(wake)
        try:
            yield wake
        finally:
            self._any.discard(wake)

    @contextlib.contextmanager
    def watch(self, allocation_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever new events of the allocation are committed."""
        wake = asyncio.Event()
        self._watchers[allocation_id].add(wake)
        try:
            yield wake
        finally:
            self._watchers[allocation_id].discard(wake)
            if not self._watchers[allocation_id]:
                del self._watchers[allocation_id]

    @contextlib.asynccontextmanager
    async def listening(self, pool: asyncpg.Pool) -> AsyncIterator[None]:
        """Hold one LISTEN connection while the context is open."""
        conn = await pool.acquire()
        await conn.add_listener(self.channel, self._notified)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await conn.remove_listener(self.channel, self._notified)
            await pool.release(conn)


class TooManyStreams(ProblemError):
    def __init__(self, open_streams: int, limit: int, retry_after_s: int):
        super().__init__(429, f"the tenant has {open_streams} event streams open, its limit is {limit}: close one "
                              "first", slug="too-many-streams", title="Too many requests",
                         headers={"Retry-After": str(retry_after_s)})


@contextlib.asynccontextmanager
async def tenant_stream(gw, tenant_id: uuid.UUID) -> AsyncIterator[None]:
    """Hold one of the tenant's event-stream places (TESSERA_SSE_PER_TENANT, or the tenant's override) while the
    context is open, all replicas counted; raises TooManyStreams (429) when none is free. The lease is renewed
    every third of its life and released on exit."""
    lease_id, ttl = uuid.uuid4(), gw.config.sse_lease_s
    async with gw.pool.acquire() as conn:
        granted, open_streams, limit = await leases.acquire_stream(conn, tenant_id, lease_id, gw.config.sse_per_tenant, ttl)
    if not granted:   # a closed stream's place frees when its replica notices, at its next keepalive at the latest
        raise TooManyStreams(open_streams, limit, max(1, round(gw.config.stream_poll_s)))

    async def renew() -> None:
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                async with gw.pool.acquire() as conn:
                    await leases.renew_stream(conn, tenant_id, lease_id, ttl)
            except (asyncpg.PostgresError, OSError) as exc:   # tried again next round, well before it expires
                log.warning("sse.lease_renewal_failed", error=repr(exc))

    renewing = asyncio.create_task(renew())
    try:
        yield
    finally:
        renewing.cancel()
        await asyncio.wait({renewing})   # a renewal in flight ends before the release (it would write the lease again)
        try:
            async with gw.pool.acquire() as conn:
                await leases.release_stream(conn, lease_id)
        except (asyncpg.PostgresError, OSError) as exc:   # it expires on its own
            log.warning("sse.lease_release_failed", error=repr(exc))
