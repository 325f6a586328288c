"""What each dashboard fragment shows: a loader per fragment reads the read models for the signed-in principal and
names its template. Pages are made of fragments; /ui/fragments/{name} serves one alone, so the page's script can
re-fetch just the parts an event changed.

Scoping: a provider admin's loaders read every tenant (tenant None); a tenant member's read its own tenant only,
filtered in SQL (adapters/dashboard*.py), exactly as the API scopes the same rows.
"""
from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from aiohttp import web
from nats.js.errors import NotFoundError

from shared.streams import DEAD_LETTER_STREAM

from ..adapters import allocations as allocation_rows
from ..adapters import dashboard as repo
from ..domain.keys import BadCursor, decode_cursor, encode_cursor
from ..domain.model import Principal
from ..http.problems import ProblemError, forbidden, not_found
from ..http.state import gateway_of
from . import fleet
from .console import console_tail
from .timeline import rows, timeline

log = structlog.get_logger()

FLEET_PAGE = 200
LIST_PAGE = 50
FEED_SIZE = 25
Loader = Callable[[web.Request, Principal], Awaitable[dict]]


@dataclass(frozen=True)
class Fragment:
    template: str
    load: Loader
    who: str = "any"   # any, operator, tenant


def scope(p: Principal) -> uuid.UUID | None:
    """The tenant a principal's reads are limited to (None: the provider admin's, every tenant); 403 for a caller
    who is neither."""
    if p.is_provider_admin:
        return None
    if p.tenant_id is None:
        raise forbidden("the dashboard shows a tenant's things to its members only")
    return p.tenant_id


def _cursor(request: web.Request):
    raw = request.query.get("cursor")
    if not raw:
        return None
    try:
        return decode_cursor(raw)
    except BadCursor:
        raise ProblemError(422, "not a cursor this dashboard returned") from None


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError):
        raise not_found(what) from None


async def _dead_letters(request: web.Request) -> int | None:
    try:
        info = await gateway_of(request).js.stream_info(DEAD_LETTER_STREAM)
    except (NotFoundError, OSError, TimeoutError) as exc:   # shown as unknown, the page still renders
        log.info("ui.dead_letters_unknown", error=repr(exc))
        return None
    return info.state.messages


async def counters(request: web.Request, p: Principal) -> dict:
    async with gateway_of(request).pool.acquire() as conn:
        states = await repo.state_counts(conn, scope(p))
        queues = await repo.queue_depths(conn) if p.is_provider_admin else []
    in_flight = states.get("PROVISIONING", 0) + states.get("RELEASING", 0)
    dead = await _dead_letters(request) if p.is_provider_admin else None
    return {"states": states, "queues": queues, "in_flight": in_flight, "dead_letters": dead}


async def fleet_map(request: web.Request, p: Principal) -> dict:
    after = request.query.get("after") or None
    async with gateway_of(request).pool.acquire() as conn:
        nodes = await repo.fleet_nodes(conn, after, FLEET_PAGE + 1)
        page, more = nodes[:FLEET_PAGE], len(nodes) > FLEET_PAGE
        ids = [n["id"] for n in page]
        allocs = await repo.live_on_nodes(conn, ids)
        names = await repo.tenant_names(conn, list({a["tenant_id"] for a in allocs}))
        totals = await repo.fleet_totals(conn)
    quarantine = {n["id"]: n["quarantined"] for n in page}
    return {"rows": fleet.fleet_rows(page, allocs, quarantine, names), "legend": fleet.legend(allocs, names),
            "totals": totals, "next": page[-1]["name"] if more else None, "after": after}


async def recent_events(request: web.Request, p: Principal) -> dict:
    async with gateway_of(request).pool.acquire() as conn:
        rows = await repo.recent_events(conn, scope(p), None, FEED_SIZE)
        names = await repo.tenant_names(conn, list({r["tenant_id"] for r in rows})) if p.is_provider_admin else {}
    return {"events": rows, "names": names}


async def allocations(request: web.Request, p: Principal) -> dict:
    after = _cursor(request)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await repo.allocations_page(conn, scope(p), LIST_PAGE + 1, after)
        names = await repo.tenant_names(conn, list({r["tenant_id"] for r in rows})) if p.is_provider_admin else {}
    page = rows[:LIST_PAGE]
    cursor = encode_cursor(page[-1]["created_at"], page[-1]["id"]) if len(rows) > LIST_PAGE else None
    return {"allocations": page, "names": names, "next": cursor, "cursor": request.query.get("cursor", "")}


async def allocation(request: web.Request, p: Principal) -> dict:
    allocation_id = _uuid(request.query.get("id", ""), "allocation")
    gw = gateway_of(request)
    async with gw.pool.acquire() as conn:
        row = await allocation_rows.get(conn, allocation_id, scope(p))
        if row is None:
            raise not_found("allocation")
        names = await repo.tenant_names(conn, [row["tenant_id"]]) if p.is_provider_admin else {}
    return {"a": row, "names": names, "timeline": await timeline(gw, row), "steps_of": rows}


async def node(request: web.Request, p: Principal) -> dict:
    node_id = _uuid(request.query.get("id", ""), "node")
    async with gateway_of(request).pool.acquire() as conn:
        row = await repo.node(conn, node_id)
        if row is None:
            raise not_found("node")
        history = await repo.health_history(conn, node_id, 100)
        allocs = await repo.live_on_nodes(conn, [node_id])
        names = await repo.tenant_names(conn, list({a["tenant_id"] for a in allocs}))
    quarantined = json.loads(row["quarantined"]) if isinstance(row["quarantined"], str) else list(row["quarantined"])
    cells = fleet.cells(row, allocs, len(quarantined), names)
    return {"n": row, "history": history, "allocs": allocs, "names": names, "cells": cells, "quarantined": quarantined}


async def latency_series(request: web.Request, p: Principal, hours: int = 6, bucket_s: int = 300) -> dict:
    """The chart's data (uPlot's columns): bucket times, then per tenant its mean scheduling latency and mean
    queue wait (null where a bucket has none)."""
    if not p.is_provider_admin:
        raise forbidden("the fleet's latencies are the provider's")
    now = datetime.now(UTC)
    async with gateway_of(request).pool.acquire() as conn:
        rows = await repo.latencies(conn, now - timedelta(hours=hours), bucket_s)
        names = await repo.tenant_names(conn, list({r["tenant_id"] for r in rows}))
    times = sorted({int(r["bucket"].timestamp()) for r in rows})
    index = {t: i for i, t in enumerate(times)}
    series: dict[uuid.UUID, dict] = {}
    for r in rows:
        s = series.setdefault(r["tenant_id"], {"tenant": names.get(r["tenant_id"], str(r["tenant_id"])[:8]),
                                               "colour": int(fleet.tenant_colour(r["tenant_id"])[1:]),
                                               "scheduling": [None] * len(times), "queue": [None] * len(times)})
        i = index[int(r["bucket"].timestamp())]
        s["scheduling"][i] = round(float(r["scheduling_s"]), 3)
        s["queue"][i] = None if r["queue_s"] is None else round(float(r["queue_s"]), 3)
    return {"times": times, "tenants": list(series.values()), "bucket_s": bucket_s,
            "from": int(now.timestamp()) - hours * 3600, "to": int(now.timestamp())}


FRAGMENTS: dict[str, Fragment] = {
    "counters": Fragment("frag_counters.html", counters),
    "fleet": Fragment("frag_fleet.html", fleet_map, "operator"),
    "events": Fragment("frag_events.html", recent_events),
    "allocations": Fragment("frag_allocations.html", allocations),
    "allocation": Fragment("frag_allocation.html", allocation),
    "node": Fragment("frag_node.html", node, "operator"),
    "console": Fragment("frag_console.html", console_tail, "tenant"),
}


def allowed(fragment: Fragment, p: Principal) -> None:
    """403 unless the principal may see the fragment (the operator's are the provider admin's)."""
    if fragment.who == "operator" and not p.is_provider_admin:
        raise forbidden("this part of the dashboard is the provider's")
    if fragment.who == "tenant" and p.tenant_id is None:
        raise forbidden("this part of the dashboard is a tenant's")
