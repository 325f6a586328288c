"""The gateway's HTTP application: middlewares, the route table, startup and shutdown, on the runtime's aiohttp app.

The API shares the port of /healthz, /readyz and /metrics (TESSERA_HTTP_PORT).
"""
from __future__ import annotations

from typing import AsyncIterator

import structlog
from aiohttp import web

from shared.runtime import Runtime

from ..adapters import identity
from ..domain.keys import hash_api_key
from ..http.audit import audit_middleware
from ..http.auth import auth_middleware
from ..http.clients import client_address_middleware
from ..http.endpoint import add_routes
from ..http.lowlevel import answer_parser_errors_with_problems
from ..http.openapi import ENDPOINTS
from ..http.policy import policy_middleware
from ..http.problems import problems_middleware
from ..http.ratelimit import rate_limit_middlewares
from ..http.state import GATEWAY, Gateway
from ..http.telemetry import telemetry_middleware
from ..settings import GatewaySettings
from .credentials import REVOKED, credential_state, on_revoked

log = structlog.get_logger()


async def _bootstrap_admin(app: web.Application) -> AsyncIterator[None]:
    """At start: the provider admin ``admin`` exists and its API key is TESSERA_BOOTSTRAP_ADMIN_KEY."""
    gw = app[GATEWAY]
    key = gw.config.bootstrap_admin_key
    if key:
        async with gw.pool.acquire() as conn, conn.transaction():
            admin_id = await identity.ensure_bootstrap_admin(conn, hash_api_key(key))
        log.info("gateway.bootstrap_admin_ready", user_id=str(admin_id))
    else:
        log.warning("gateway.no_bootstrap_admin_key")
    yield


async def _listen(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY]
    async with gw.hub.listening(gw.pool):
        yield


def create_app(rt: Runtime, config: GatewaySettings, app: web.Application | None = None) -> web.Application:
    """Configure ``app`` (default: the runtime's, so it is served by ``rt.start()``); returns it."""
    app = rt.http if app is None else app
    gw = Gateway(rt, config)
    app[GATEWAY] = gw
    # outermost first: every request gets a span and an access line, every mutation an audit record (with the
    # span's trace id and the final status: outside problems, so 4xx problems and 401s are recorded too), every
    # error a problem document; then who is calling (auth), whether it is within its rate (rate limits) and whether
    # policy lets it (a denial is a problem, and audited)
    # — after the client's address behind the provider's proxies (http/clients.py) and the shedder, which refuses a
    # flooding tenant's requests before all that work (http/ratelimit.py)
    shed, limit = rate_limit_middlewares(gw)
    app.middlewares.extend([client_address_middleware(config.trusted_proxies), shed, telemetry_middleware(rt.service), audit_middleware, problems_middleware,
                            auth_middleware(gw.tokens), limit, policy_middleware(gw)])
    add_routes(app, ENDPOINTS)
    answer_parser_errors_with_problems(app)   # aiohttp's own answers to unparsable requests: problem+json too
    app.cleanup_ctx.append(_bootstrap_admin)
    app.cleanup_ctx.append(_listen)
    app.cleanup_ctx.append(credential_state)   # signing keys, revocation list (docs/credentials.md)
    rt.listen(REVOKED, on_revoked(gw))
    app.on_shutdown.append(gw.streams.close_all)
    return app
