"""GET /ui/stream: one server-sent event stream per dashboard page, telling the page's script what changed (it
then re-fetches only the fragments that show it).

Events: ``allocation`` ({seq, allocation_id, type}) for each event of an allocation the caller may see (the
tenant's own; the provider admin's: every tenant's), read like GET /v1/events reads them (api/events/feed.py)
and woken by the projection's NOTIFY; ``node`` ({}) when any node's document, capacity or health changed
(provider admin only: polled every NODE_POLL_S). The stream ends when the sign-in expires, so the page's
reconnect meets the 401 and goes back to the sign-in form. A tenant member's stream holds one of its tenant's
stream leases, like any other event stream.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime

import structlog
from aiohttp import web

from ..adapters import dashboard as repo
from ..adapters.event_feed import FeedFilter
from ..api.events.feed import FeedReader
from ..domain.model import Principal
from ..http.sse import KEEPALIVE, event_bytes, json_line, open_stream, tenant_stream
from ..http.state import Gateway, gateway_of
from . import session, views

log = structlog.get_logger()

NODE_POLL_S = 1.0
KEEPALIVE_S = 15.0
EPOCH = datetime.fromtimestamp(0, UTC)


async def _pump(gw: Gateway, resp: web.StreamResponse, p: Principal, reader: FeedReader, until: float) -> None:
    async with gw.pool.acquire() as conn:
        _, nodes_seen = await repo.nodes_changed_since(conn, EPOCH)
    last_write = time.monotonic()
    with gw.hub.watch_any() as wake, gw.streams.track(wake.set):
        while not gw.streams.closing.is_set() and time.time() < until:
            wake.clear()
            async with gw.pool.acquire() as conn:
                rows, more = await reader.read(conn)
                changed = False
                if p.is_provider_admin:
                    changed, nodes_seen = await repo.nodes_changed_since(conn, nodes_seen)
            for r in rows:
                await resp.write(event_bytes(str(r["seq"]), "allocation", json_line(
                    {"seq": r["seq"], "allocation_id": r["allocation_id"], "type": r["type"]})))
            if changed:
                await resp.write(event_bytes("node", "node", "{}"))
            if rows or changed:
                last_write = time.monotonic()
            if more:
                continue
            poll = NODE_POLL_S if p.is_provider_admin or reader.gaps else gw.config.stream_poll_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), poll)
            if time.monotonic() - last_write >= KEEPALIVE_S:
                await resp.write(KEEPALIVE)
                last_write = time.monotonic()


def _after(request: web.Request) -> int | None:
    """Where the page's events begin: ``?after=`` (the newest seq when the page was rendered), so nothing
    committed between the render and the stream's start is missed."""
    raw = request.query.get("after", "")
    return int(raw) if raw.isdigit() and len(raw) <= 18 else None


async def ui_stream(request: web.Request) -> web.StreamResponse:
    p = await session.principal(request)   # 401 problem: the script sends the browser to the sign-in form
    tenant_id = views.scope(p)
    gw = gateway_of(request)
    until = gw.tokens.claims(request.cookies[session.COOKIE])["exp"]
    async with gw.pool.acquire() as conn:
        reader = await FeedReader.start(conn, FeedFilter(tenant_id), _after(request))
    lease = tenant_stream(gw, tenant_id) if tenant_id is not None else contextlib.nullcontext()
    async with lease:
        resp = await open_stream(request)
        try:
            await _pump(gw, resp, p, reader, until)
        except (ConnectionResetError, ConnectionAbortedError):
            pass
        except Exception as exc:   # the response has started
            log.error("ui.stream_failed", error=repr(exc))
    return resp
