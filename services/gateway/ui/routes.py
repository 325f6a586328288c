"""The dashboard's routes, under /ui/ (none of them in the OpenAPI document: that lists the API's route table,
http.ENDPOINTS, only)."""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

from .pages import ROUTES
from .render import secure_headers
from .stream import ui_stream

STATIC = Path(__file__).parent / "static"


def add_ui_routes(app: web.Application) -> None:
    """Mount /ui/ on ``app``: the pages, fragments, live stream and static files, every response with the CSP."""
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    app.router.add_get("/ui/stream", ui_stream)
    app.router.add_static("/ui/static/", STATIC, append_version=False)
    app.on_response_prepare.append(secure_headers)
