"""GET /v1/events: every event of the caller's tenant's allocations as one live stream (server-sent events).

Each event: ``id:`` its seq (a number, increasing), ``event:`` its type, ``data:`` {seq, allocation_id, tenant_id,
type, envelope} as compact JSON. The stream starts with new events only; ``Last-Event-ID`` (what EventSource sends
on reconnect) or ``?after=`` resumes after that seq, replaying at most REPLAY_MAX seqs before going live. Woken by
the projection's NOTIFY (any allocation), re-read every poll interval anyway. An event that commits after a newer
one is still delivered, late (its id lower than the one before it): see api/events/feed.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import uuid

import structlog
from aiohttp import web

from ...adapters import allocations
from ...adapters.event_feed import FeedFilter
from ...domain.model import Principal
from ...http.auth import principal_of
from ...http.endpoint import EVENT_STREAM, Endpoint, Param
from ...http.inputs import header_value, query_value
from ...http.problems import forbidden, not_found
from ...http.schema_base import integer, text
from ...http.sse import KEEPALIVE, open_stream, tenant_stream
from ...http.state import Gateway, gateway_of
from .feed import REPLAY_MAX, FeedReader, feed_event

log = structlog.get_logger()

TENANT = Param("tenant_id", "query", "Only this tenant's events (a provider admin's filter; a tenant member may "
               "name only its own tenant).", uuid.UUID)
ALLOCATION = Param("allocation_id", "query", "Only this allocation's events.", uuid.UUID)
TYPE_PREFIX = Param("type", "query", "Only the events whose type starts with this, e.g. `allocation.` or "
                    "`saga.step_changed`.", text(128, min_length=1, pattern=r"^[A-Za-z0-9_.-]+$"))
AFTER = Param("after", "query", "Resume after this seq (as Last-Event-ID does).", integer(0, 2**62))
LAST_EVENT_ID = Param("Last-Event-ID", "header", "Resume after this seq (sent by EventSource on reconnect); "
                      "anything but a number starts with new events.", text(128))


def _resume_after(request: web.Request) -> int | None:
    after = query_value(request, AFTER)
    if after is not None:
        return after
    last = (header_value(request, LAST_EVENT_ID) or "").strip()
    return int(last) if last.isdigit() and len(last) <= 18 else None


async def _scope(gw: Gateway, p: Principal, request: web.Request) -> FeedFilter:
    """The events the caller may see and asked for: a tenant member only its tenant's (403 for another tenant,
    404 for an allocation not its own), a provider admin any."""
    tenant_id, allocation_id = query_value(request, TENANT), query_value(request, ALLOCATION)
    if not p.is_provider_admin:
        if p.tenant_id is None:
            raise forbidden("the event feed is a tenant's; sign in as a tenant member")
        if tenant_id is not None and tenant_id != p.tenant_id:
            raise forbidden("a tenant member sees only its own tenant's events")
        tenant_id = p.tenant_id
        if allocation_id is not None:
            async with gw.pool.acquire() as conn:
                if await allocations.get(conn, allocation_id, tenant_id) is None:
                    raise not_found("allocation")
    return FeedFilter(tenant_id, allocation_id, query_value(request, TYPE_PREFIX))


async def pump(gw: Gateway, resp: web.StreamResponse, reader: FeedReader) -> None:
    """Write the feed's events until shutdown; woken by any NOTIFY, re-reading every poll interval anyway."""
    with gw.hub.watch_any() as wake, gw.streams.track(wake.set):
        while not gw.streams.closing.is_set():
            wake.clear()   # before reading: a commit during the read wakes the next round
            async with gw.pool.acquire() as conn:
                rows, more = await reader.read(conn)
            for row in rows:
                await resp.write(feed_event(row))
            if more:
                continue
            try:
                await asyncio.wait_for(wake.wait(), 1.0 if reader.gaps else gw.config.stream_poll_s)
            except TimeoutError:
                await resp.write(KEEPALIVE)


async def tenant_events(request: web.Request) -> web.StreamResponse:
    p, gw = principal_of(request), gateway_of(request)
    feed = await _scope(gw, p, request)
    async with gw.pool.acquire() as conn:
        reader = await FeedReader.start(conn, feed, _resume_after(request))
    # a tenant member's feed holds one of its tenant's stream places (429 when none is free); the provider's is not
    # a tenant's and is not counted
    lease = tenant_stream(gw, p.tenant_id) if p.tenant_id is not None else contextlib.nullcontext()
    async with lease:
        resp = await open_stream(request)
        try:
            await pump(gw, resp, reader)
        except (ConnectionResetError, ConnectionAbortedError):
            pass   # the client left
        except Exception as exc:   # the response has started: a problem document can no longer be sent
            log.error("sse.event_feed_failed", error=repr(exc))
    return resp


ENDPOINTS = [
    Endpoint("GET", "/v1/events", tenant_events, "streamEvents", "Stream every event of the tenant's allocations "
             "(server-sent events)", "events", {200: EVENT_STREAM},
             params=(TENANT, ALLOCATION, TYPE_PREFIX, AFTER, LAST_EVENT_ID), errors=(401, 403, 404, 422, 429),
             description="Every event of the caller's tenant's allocations (a provider admin: of every tenant, "
                         "`tenant_id` to narrow it), as they are projected. Each event's `id` is its `seq` "
                         "(increasing), `event` its type, `data` {seq, allocation_id, tenant_id, type, envelope} "
                         "(JSON). Starts with new events only; `Last-Event-ID` or `after` resumes after that seq, "
                         f"replaying at most {REPLAY_MAX} seqs. An event committed after a newer one arrives late, "
                         "its id lower than the previous one. A tenant member's stream counts against "
                         "TESSERA_SSE_PER_TENANT (one more is a 429 `too-many-streams`)."),
]
