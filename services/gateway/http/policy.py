"""Policy enforcement on every mutating route (STUB: filled in by the policy work)."""
from __future__ import annotations

from aiohttp import web


def policy_middleware(gw):
    @web.middleware
    async def enforce(request: web.Request, handler) -> web.StreamResponse:
        return await handler(request)
    return enforce
