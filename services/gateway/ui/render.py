"""HTML for the dashboard: Jinja2 templates (ui/templates/) with autoescaping on, so every value a page shows is
escaped; and the headers every /ui/ response carries (a strict Content-Security-Policy: no inline script or
style, nothing from elsewhere)."""
from __future__ import annotations

import functools
import json
from datetime import UTC, datetime
from pathlib import Path

import jinja2
from aiohttp import web

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            # not no-referrer: under it a browser sends "Origin: null" on a form POST, and sign-in checks Origin
            "Referrer-Policy": "same-origin",
            "X-Frame-Options": "DENY"}
TEMPLATES = Path(__file__).parent / "templates"


def _ago(at: datetime | None) -> str:
    if at is None:
        return "—"
    s = int((datetime.now(UTC) - at).total_seconds())
    if s < 60:
        return f"{max(s, 0)}s ago"
    if s < 3600:
        return f"{s // 60}m ago"
    return f"{s // 3600}h ago" if s < 86400 else f"{s // 86400}d ago"


def _when(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if at else "—"


def _short(value) -> str:
    return str(value)[:8] if value else "—"


def _size(n: int | None) -> str:
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} PiB"


def _money(minor: int | None, currency: str | None) -> str:
    return "—" if minor is None else f"{minor / 100:,.2f} {currency or ''}".strip()


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(ago=_ago, when=_when, short=_short, size=_size, money=_money,
                       compact=lambda v: json.dumps(v, separators=(",", ":"), default=str))
    return env


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)


def html(template: str, status: int = 200, **context) -> web.Response:
    return web.Response(status=status, text=render(template, **context), content_type="text/html")


async def secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every /ui/ response (pages, fragments, stream, static files, errors) gets the CSP; every
    one but the static files is never cached (it shows what the signed-in caller may see)."""
    if not request.path.startswith("/ui/") and request.path != "/ui":
        return
    response.headers.update(_HEADERS)
    if not request.path.startswith("/ui/static/"):
        response.headers["Cache-Control"] = "no-store"
