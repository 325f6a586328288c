"""GET /v1/allocations/{id}/events: the allocation's stored events, then live ones, as SSE.

Each event: ``id:`` the event id, ``event:`` its type, ``data:`` its envelope. A client
reconnecting with ``Last-Event-ID`` resumes after that event.
"""
from __future__ import annotations

import asyncio
import contextlib
import uuid

import structlog
from aiohttp import web

from ...adapters import allocations as repo
from ...http.auth import require_tenant_member
from ...http.endpoint import EVENT_STREAM, Endpoint, Param
from ...http.inputs import header_value, path_uuid
from ...http.params import ALLOCATION_ID
from ...http.problems import not_found
from ...http.schema_base import text
from ...http.sse import KEEPALIVE, event_bytes, open_stream, tenant_stream
from ...http.state import Gateway, gateway_of

log = structlog.get_logger()

LAST_EVENT_ID = Param("Last-Event-ID", "header", "Resume after this event id (sent by EventSource on reconnect); "
                      "one this allocation never had replays from the start.", text(128))
_PAGE = 500


async def _resume_after(conn, allocation_id: uuid.UUID, last_event_id: str | None) -> int:
    if not last_event_id:
        return 0
    with contextlib.suppress(ValueError):
        return await repo.seq_of(conn, allocation_id, uuid.UUID(last_event_id)) or 0
    return 0


async def _pump(gw: Gateway, resp: web.StreamResponse, allocation_id: uuid.UUID, last_seq: int) -> None:
    """Write events past ``last_seq`` until shutdown; woken by NOTIFY, re-reading every poll interval anyway."""
    with gw.hub.watch(str(allocation_id)) as wake, gw.streams.track(wake.set):
        while not gw.streams.closing.is_set():
            wake.clear()  # before reading: a commit during the read wakes the next round
            async with gw.pool.acquire() as conn:
                rows = await repo.events_after(conn, allocation_id, last_seq, _PAGE)
            for r in rows:
                await resp.write(event_bytes(str(r["event_id"]), r["type"], r["envelope"]))
                last_seq = r["seq"]
            if len(rows) == _PAGE:
                continue
            try:
                await asyncio.wait_for(wake.wait(), gw.config.stream_poll_s)
            except TimeoutError:
                await resp.write(KEEPALIVE)


async def allocation_events(request: web.Request) -> web.StreamResponse:
    p = require_tenant_member(request)
    allocation_id = path_uuid(request, "allocation_id", "allocation")
    gw = gateway_of(request)
    async with gw.pool.acquire() as conn:
        if await repo.get(conn, allocation_id, p.tenant_id) is None:
            raise not_found("allocation")
        last_seq = await _resume_after(conn, allocation_id, header_value(request, LAST_EVENT_ID))
    async with tenant_stream(gw, p.tenant_id):   # a 429 when the tenant holds as many streams as it may
        resp = await open_stream(request)
        try:
            await _pump(gw, resp, allocation_id, last_seq)
        except (ConnectionResetError, ConnectionAbortedError):
            pass  # the client left
        except Exception as exc:  # the response has started: a problem document can no longer be sent
            log.error("sse.allocation_stream_failed", allocation_id=str(allocation_id), error=repr(exc))
    return resp


ENDPOINTS = [
    Endpoint("GET", "/v1/allocations/{allocation_id}/events", allocation_events, "streamAllocationEvents",
             "Stream the allocation's events (server-sent events)", "allocations", {200: EVENT_STREAM},
             params=(ALLOCATION_ID, LAST_EVENT_ID), errors=(401, 403, 404),
             description="Replays the stored events, then sends new ones as they are projected. Each event's `id` is "
                         "the event id, `event` its type and `data` its envelope (JSON). A tenant holds at most "
                         "TESSERA_SSE_PER_TENANT streams open at once (all its users together): one more is a 429 "
                         "`too-many-streams`."),
]
