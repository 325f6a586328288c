"""GET /v1/allocations/{id}/console: the serial console of the allocation's instance, read live from the
node-agent on its node (nothing of it is stored in the gateway).

``follow=false``: the console's last ``tail`` bytes, as text/plain. ``follow=true``: the same, then what the
console prints next, as one chunked text/plain response (the gateway asks the node every ``console_poll_s``
from where the last read ended) until the client leaves, the allocation leaves ACTIVE, the node stops
answering for ``_GIVE_UP_AFTER`` reads in a row, ``console_follow_max_s`` pass, or the gateway shuts down.
Each read of a console is logged with the user id (audit).
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

import structlog
from aiohttp import web

from ...adapters import allocations as views
from ...http.auth import require_tenant_member
from ...http.endpoint import TEXT_PLAIN, Endpoint, Param
from ...http.inputs import path_uuid, query_value
from ...http.params import ALLOCATION_ID
from ...http.problems import ProblemError, not_found
from ...http.rpc_problems import answered
from ...http.schema_base import integer
from ...http.state import Gateway, gateway_of
from .console_views import NodeConsole
from .power import node_of

log = structlog.get_logger()
MAX_TAIL = 1 << 20
_FOLLOW_CHUNK = 64 * 1024     # bytes asked for per read while following
_GIVE_UP_AFTER = 20           # reads in a row the node did not answer (about 10 s at the default poll)
TAIL = Param("tail", "query", "How many bytes of the console's end to send (at most 1 MiB).", integer(1, MAX_TAIL),
             default=65536)
FOLLOW = Param("follow", "query", "true: keep the response open and send what the console prints next.",
               Literal["true", "false"], default="false")


async def _read(console: NodeConsole, offset: int, limit: int):
    """One read; a node whose agent is not connected is a 503 naming it (at once), one that does not answer in
    time a 504, its failure a 502, no console there a 404."""
    with answered(f"node {console.node_id}", "node", "the console cannot be read now", "read the console",
                  allocation_id=str(console.allocation_id)):
        chunk = await console.read(offset, limit)
    if not chunk.found:
        raise ProblemError(404, "the node has no console of this allocation (its instance is not there, or no "
                                "longer)", slug="no-console")
    return chunk


def _utf8(text: str) -> bytes:
    """The console's text as UTF-8 (a lone surrogate the node's JSON may carry becomes '?')."""
    return text.encode("utf-8", "replace")


async def _still_active(gw: Gateway, console: NodeConsole) -> bool:
    async with gw.pool.acquire() as conn:
        row = await views.get(conn, console.allocation_id, console.tenant_id)
    return row is not None and row["state"] == "ACTIVE"


async def _follow(gw: Gateway, request: web.Request, resp: web.StreamResponse, console: NodeConsole, offset: int) -> None:
    """Write what the console prints from ``offset`` on, until one of the module's ends."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + gw.config.console_follow_max_s
    wake, silent, more = asyncio.Event(), 0, False
    with gw.streams.track(wake.set):
        while not gw.streams.closing.is_set():
            left = deadline - loop.time()
            if left <= 0:
                return
            if not more:   # wait, unless the last read was a full chunk (the console has more at once)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), min(gw.config.console_poll_s, left))
            transport = request.transport
            if gw.streams.closing.is_set() or transport is None or transport.is_closing():
                return
            if not await _still_active(gw, console):
                return
            try:
                chunk = await _read(console, offset, _FOLLOW_CHUNK)
            except ProblemError as exc:
                silent = silent + 1 if exc.status in (503, 504) else _GIVE_UP_AFTER
                if silent >= _GIVE_UP_AFTER:
                    return
                continue
            silent, more = 0, chunk.next_offset - offset >= _FOLLOW_CHUNK
            if chunk.text:
                await resp.write(_utf8(chunk.text))
            offset = chunk.next_offset


async def read_console(request: web.Request) -> web.StreamResponse:
    p = require_tenant_member(request)
    tail, follow = query_value(request, TAIL), query_value(request, FOLLOW) == "true"
    gw = gateway_of(request)
    async with gw.pool.acquire() as conn:
        row = await views.get(conn, path_uuid(request, "allocation_id", "allocation"), p.tenant_id)
    if row is None:
        raise not_found("allocation")
    console = NodeConsole(gw.rt.broker.connection, gw.rt.catalog, node_of(row), row["id"], p.tenant_id,
                          gw.config.node_rpc_timeout_s)
    log.info("audit.console_read", user_id=str(p.user_id), tenant_id=str(p.tenant_id), allocation_id=str(row["id"]),
             node_id=str(console.node_id), tail=tail, follow=follow)
    first = await _read(console, -1, tail)
    if not follow:
        return web.Response(body=_utf8(first.text), content_type=TEXT_PLAIN, charset="utf-8",
                            headers={"Cache-Control": "no-store"})
    resp = web.StreamResponse(headers={"Content-Type": f"{TEXT_PLAIN}; charset=utf-8", "Cache-Control": "no-store",
                                       "X-Accel-Buffering": "no"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        await resp.write(_utf8(first.text))
        await _follow(gw, request, resp, console, first.next_offset)
    except (ConnectionResetError, ConnectionAbortedError):
        pass   # the client left
    except Exception as exc:  # the response has started: a problem document can no longer be sent
        log.error("console.follow_failed", allocation_id=str(row["id"]), error=repr(exc))
    return resp


ENDPOINTS = [
    Endpoint("GET", "/v1/allocations/{allocation_id}/console", read_console, "readConsole",
             "Read the serial console of the allocation's instance", "allocations", {200: TEXT_PLAIN},
             params=(ALLOCATION_ID, TAIL, FOLLOW), errors=(401, 403, 404, 409, 422, 502, 503, 504),
             description="text/plain (UTF-8): the console's last `tail` bytes, read live from the node-agent on the "
                         "allocation's node. With `follow=true` the response stays open (chunked text/plain) and "
                         "carries what the console prints next, read from the node about every 0.5 s, until the "
                         "client disconnects, the allocation leaves ACTIVE, the node stops answering, or the "
                         "gateway's maximum follow time (TESSERA_CONSOLE_FOLLOW_MAX_S, default 3600 s) passes. An "
                         "allocation without a node yet is a 409; a node whose agent is not connected is a 503 "
                         "naming it (at once, with Retry-After), one that does not answer in time a 504 (502 when "
                         "it answers with an error); a node without a console of the allocation is a 404 "
                         "(`no-console`). Each read is recorded with the caller's user id."),
]
