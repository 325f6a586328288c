"""Operator views (provider admins): the newest dead letters, and a live SSE feed of the streams."""
from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated

import structlog
from aiohttp import web
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError
from pydantic import Field

from shared.streams import DEAD_LETTER_STREAM, stream_configs

from ...http.auth import require_provider_admin
from ...http.endpoint import EVENT_STREAM, Endpoint, Param, respond
from ...http.inputs import parse_value, query_value
from ...http.problems import validation_problem
from ...http.schema_base import FieldError, integer, text
from ...http.sse import KEEPALIVE, event_bytes, json_line, open_stream
from ...http.state import gateway_of
from .rules import intersect, valid_filter
from .schemas import DeadLetter, DeadLetterList

log = structlog.get_logger()

DLQ_HEADER_PREFIX = "Tessera-DLQ-"
_QUEUE_MAX = 10_000


def decode_body(data: bytes | None):
    """A message body as JSON when it is JSON, else as text."""
    text = (data or b"").decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


async def dead_letters(request: web.Request) -> web.Response:
    """The newest ``limit`` messages of the dead-letter stream, newest first (read by sequence)."""
    require_provider_admin(request)
    limit = query_value(request, DEAD_LETTER_LIMIT)
    js = gateway_of(request).js
    info = await js.stream_info(DEAD_LETTER_STREAM)
    direct = bool(info.config.allow_direct)
    items: list[DeadLetter] = []
    seq, first = info.state.last_seq, max(info.state.first_seq, 1)
    while seq >= first and len(items) < limit:
        try:
            msg = await js.get_msg(DEAD_LETTER_STREAM, seq, direct=direct)
        except NotFoundError:  # a deleted sequence leaves a gap
            seq -= 1
            continue
        headers = {k: str(v) for k, v in (msg.headers or {}).items() if k.startswith(DLQ_HEADER_PREFIX)}
        items.append(DeadLetter(seq=seq, subject=msg.subject or "", time=msg.time, headers=headers, body=decode_body(msg.data)))
        seq -= 1
    return respond(DeadLetterList(items=items))


def subscription_plan(filters: list[str]) -> list[tuple[str, str]]:
    """(stream, filter) pairs covering exactly the subjects asked for; a filter inside another is dropped."""
    plan: list[tuple[str, str]] = []
    for cfg in stream_configs():
        wanted = {f for f in (intersect(q, s) for q in filters for s in cfg.subjects) if f}
        for f in sorted(wanted):
            if not any(g != f and intersect(f, g) == f for g in wanted):
                plan.append((cfg.name, f))
    return plan


def _filters(request: web.Request) -> list[str]:
    given = request.query.getall(SUBJECTS.name, [])
    if len(given) > SUBJECTS.schema["maxItems"]:
        raise validation_problem([FieldError(field="subjects", message=f"at most {SUBJECTS.schema['maxItems']} times",
                                             code="query")])
    values = [parse_value(SUBJECT_LIST, v) for v in given]
    raw = [s.strip() for v in values for s in v.split(",") if s.strip()] or [">"]
    bad = [s for s in raw if not valid_filter(s)]
    if bad:
        raise validation_problem([FieldError(field="subjects", message=f"not a NATS subject filter: {b}", code="query")
                                  for b in bad])
    return raw


class _Feed:
    """Messages from the ordered consumers, bounded: a client too slow to keep up is cut off, not buffered forever."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=_QUEUE_MAX)
        self.overflowed = self.closed = False

    def close(self) -> None:
        """End the feed (server shutdown): the relay returns at its next wake-up."""
        self.closed = True
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)

    async def on_message(self, msg) -> None:
        try:
            self.queue.put_nowait(msg)
        except asyncio.QueueFull:
            self.overflowed = True


async def _relay(resp: web.StreamResponse, feed: _Feed, poll_s: float) -> None:
    while True:
        try:
            msg = await asyncio.wait_for(feed.queue.get(), poll_s)
        except TimeoutError:
            await resp.write(KEEPALIVE)
            continue
        if feed.closed:
            return
        if feed.overflowed:
            await resp.write(event_bytes("overflow", "stream.overflow", json_line({"detail": "client too slow; reconnect"})))
            return
        md = msg.metadata
        envelope = decode_body(msg.data)
        type_ = (msg.headers or {}).get("Tessera-Type") or (envelope.get("type") if isinstance(envelope, dict) else None)
        data = {"stream": md.stream, "seq": md.sequence.stream, "subject": msg.subject, "type": type_, "envelope": envelope}
        await resp.write(event_bytes(f"{md.stream}:{md.sequence.stream}", type_ or "message", json_line(data)))


async def ops_events(request: web.Request) -> web.StreamResponse:
    """Every new message on the project's streams matching ``subjects`` (ordered consumers, deliver new)."""
    require_provider_admin(request)
    plan = subscription_plan(_filters(request))
    if not plan:
        raise validation_problem([FieldError(field="subjects", message="matches no Tessera stream", code="query")])
    gw, feed = gateway_of(request), _Feed()
    js, subs = gw.js, []
    with gw.streams.track(feed.close):
        try:
            for stream, subject in plan:
                subs.append(await js.subscribe(subject, stream=stream, cb=feed.on_message, ordered_consumer=True,
                                               deliver_policy=DeliverPolicy.NEW))
            resp = await open_stream(request)
            try:
                await _relay(resp, feed, gw.config.stream_poll_s)
            except (ConnectionResetError, ConnectionAbortedError):
                pass
            return resp
        finally:
            for sub in subs:
                try:
                    await sub.unsubscribe()
                except Exception as exc:  # the connection may be gone; the server drops ephemeral consumers anyway
                    log.debug("sse.unsubscribe_failed", error=repr(exc))


DEAD_LETTER_LIMIT = Param("limit", "query", "How many.", integer(1, 500), default=20)
SUBJECT_LIST = Param("subjects", "query", "One value of subjects.",
                     text(1024, min_length=1, pattern=r"^[A-Za-z0-9_$*>., -]*$"))
SUBJECTS = Param("subjects", "query", "Comma-separated NATS subject filters (default: everything), e.g. "
                 "`allocation.>,saga.evt.>`; may be repeated.",
                 Annotated[list[SUBJECT_LIST.type], Field(max_length=16)])

ENDPOINTS = [
    Endpoint("GET", "/v1/ops/dead-letters", dead_letters, "listDeadLetters", "Newest dead-lettered messages (provider admin)",
             "ops", {200: DeadLetterList}, params=(DEAD_LETTER_LIMIT,), errors=(401, 403, 422)),
    Endpoint("GET", "/v1/ops/events", ops_events, "streamOpsEvents", "Live feed of the message streams (provider admin)",
             "ops", {200: EVENT_STREAM}, params=(SUBJECTS,), errors=(401, 403, 422),
             description="Server-sent events; each event's `id` is `<stream>:<sequence>`, `event` the message type, "
                         "`data` {stream, seq, subject, type, envelope}."),
]
