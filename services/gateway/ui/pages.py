"""The dashboard's pages and fragment endpoints.

A page answers HTML for a browser, errors included (an HTML error page; a sign-in that expired goes back to
/ui/login). A fragment (/ui/fragments/{name}) is HTML too, but its errors are problem+json: the page's script
reads them, never a person. The JSON series the chart draws is the same.
"""
from __future__ import annotations

import json

from aiohttp import web

from ..adapters import event_feed
from ..domain.model import Principal
from ..http.problems import ProblemError, not_found
from ..http.state import gateway_of
from . import session, tenant_pages, views
from .render import html, render


def _nav(p: Principal) -> list[tuple[str, str]]:
    items = [("/ui/", "Overview"), ("/ui/allocations", "Allocations")]
    if not p.is_provider_admin:
        items += [("/ui/resources", "Networks & volumes"), ("/ui/billing", "Usage & billing")]
        if p.role == "tenant_admin":
            items.append(("/ui/audit", "Audit trail"))
    return items


def page(handler):
    """A page handler ``(request, principal) -> (template, context)``, signed in, rendered with the layout."""
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            p = await session.principal(request)
            async with gateway_of(request).pool.acquire() as conn:
                head = await event_feed.head_seq(conn)   # before the fragments read: the stream resumes here
            template, context = await handler(request, p)
        except ProblemError as exc:
            if exc.status == 401:
                raise web.HTTPSeeOther("/ui/login") from None
            return html("error.html", status=exc.status, title=exc.title, detail=exc.detail, nav=[], who=None)
        return html(template, nav=_nav(p), who=p, path=request.path, head_seq=head, **context)
    return wrapped


async def _fragments(request: web.Request, p: Principal, names: list[str], **query) -> dict[str, str]:
    """Each named fragment rendered for the principal (the page embeds them; the script re-fetches them)."""
    out = {}
    for name in names:
        f = views.FRAGMENTS[name]
        views.allowed(f, p)
        req = request.clone(rel_url=request.rel_url.with_query({**request.query, **query})) if query else request
        out[name] = render(f.template, who=p, **await f.load(req, p))
    return out


@page
async def overview(request: web.Request, p: Principal):
    views.scope(p)
    if p.is_provider_admin:
        frags = await _fragments(request, p, ["counters", "fleet", "events"])
        return "operator.html", {"title": "Fleet", "frags": frags, "query": request.query_string}
    frags = await _fragments(request, p, ["counters", "allocations", "events"])
    return "tenant.html", {"title": "Overview", "frags": frags, "query": request.query_string}


@page
async def allocations(request: web.Request, p: Principal):
    views.scope(p)
    frags = await _fragments(request, p, ["allocations"])
    return "allocations.html", {"title": "Allocations", "frags": frags, "query": request.query_string}


@page
async def allocation(request: web.Request, p: Principal):
    allocation_id = request.match_info["allocation_id"]
    frags = await _fragments(request, p, ["allocation"], id=allocation_id)
    return "allocation.html", {"title": "Allocation", "frags": frags, "id": allocation_id}


@page
async def node(request: web.Request, p: Principal):
    if not p.is_provider_admin:
        raise not_found("page")   # a tenant never learns which nodes exist
    node_id = request.match_info["node_id"]
    frags = await _fragments(request, p, ["node"], id=node_id)
    return "node.html", {"title": "Node", "frags": frags, "id": node_id}


async def fragment(request: web.Request) -> web.Response:
    """GET /ui/fragments/{name}: one fragment's HTML (errors as problem+json)."""
    p = await session.principal(request)
    f = views.FRAGMENTS.get(request.match_info["name"])
    if f is None:
        raise not_found("fragment")
    views.allowed(f, p)
    return web.Response(text=render(f.template, who=p, **await f.load(request, p)), content_type="text/html")


async def latency(request: web.Request) -> web.Response:
    """GET /ui/data/latency.json: the operator chart's series (errors as problem+json)."""
    p = await session.principal(request)
    return web.Response(text=json.dumps(await views.latency_series(request, p)), content_type="application/json")


async def login_form(request: web.Request) -> web.Response:
    return html("login.html", title="Sign in", nav=[], who=None, error=None)


async def login(request: web.Request) -> web.StreamResponse:
    session.check_origin(request)
    form = await request.post()
    try:
        return await session.sign_in(request, str(form.get("api_key", "")))
    except ProblemError as exc:
        if exc.status != 401:
            raise
        return html("login.html", status=401, title="Sign in", nav=[], who=None, error="Unknown or revoked API key.")


async def logout(request: web.Request) -> web.StreamResponse:
    session.check_origin(request)
    return session.sign_out(request)


async def root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPMovedPermanently("/ui/")


ROUTES = [
    ("GET", "/ui", root), ("GET", "/ui/", overview), ("GET", "/ui/allocations", allocations),
    ("GET", "/ui/allocations/{allocation_id}", allocation), ("GET", "/ui/nodes/{node_id}", node),
    ("GET", "/ui/fragments/{name}", fragment), ("GET", "/ui/data/latency.json", latency),
    ("GET", "/ui/login", login_form), ("POST", "/ui/login", login), ("POST", "/ui/logout", logout),
    ("GET", "/ui/resources", page(tenant_pages.resources)), ("GET", "/ui/billing", page(tenant_pages.billing)),
    ("GET", "/ui/audit", page(tenant_pages.audit)),
]
