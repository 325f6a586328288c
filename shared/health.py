"""/healthz, /readyz and Prometheus /metrics for every service (aiohttp)."""
from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

ReadinessCheck = Callable[[], Awaitable[bool]]
READINESS = web.AppKey("readiness", list)


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    failing = []
    for name, check in request.app[READINESS]:
        try:
            ok = await check()
        except Exception:  # a readiness probe reports, it does not raise
            ok = False
        if not ok:
            failing.append(name)
    status = 200 if not failing else 503
    return web.json_response({"status": "ready" if not failing else "not ready", "failing": failing}, status=status)


async def metrics(_: web.Request) -> web.Response:
    body = generate_latest()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_health_routes(app: web.Application, checks: list[tuple[str, ReadinessCheck]]) -> None:
    app[READINESS] = checks
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
