"""Per-tenant and per-user rate limits (STUB: filled in by the rate-limit work)."""
from __future__ import annotations

from aiohttp import web


def rate_limit_middleware(gw):
    @web.middleware
    async def limit(request: web.Request, handler) -> web.StreamResponse:
        return await handler(request)
    return limit
