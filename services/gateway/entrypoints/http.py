"""The gateway's HTTP application: the route table (every slice's endpoints, gathered here and only here),
middlewares, startup and shutdown, on the runtime's aiohttp app.

The API shares the port of /healthz, /readyz and /metrics (TESSERA_HTTP_PORT).
"""
from __future__ import annotations

from collections.abc import AsyncIterator

import structlog
from aiohttp import web

from shared.runtime import Runtime

from ..adapters import identity
from ..api.allocations import console, power, steps
from ..api.allocations import routes as allocations
from ..api.audit import routes as audit
from ..api.billing import budgets, invoices
from ..api.billing import usage as billing
from ..api.clusters import routes as clusters
from ..api.events import routes as events
from ..api.identity import api_keys, auth, ssh_keys, tenants
from ..api.inventory import bmc, faults, health, images, nodes, pools, quotas, shapes, wipes
from ..api.jobs import routes as jobs
from ..api.limits import routes as rate_limits
from ..api.networks import routes as networks
from ..api.ops import routes as ops
from ..api.policies import routes as policies
from ..api.spot import routes as spot
from ..api.storage import attachments as volume_attachments
from ..api.storage import quotas as storage_quotas
from ..api.storage import volumes
from ..domain.keys import hash_api_key
from ..http.audit import audit_middleware
from ..http.auth import auth_middleware
from ..http.clients import client_address_middleware
from ..http.endpoint import AuditState, add_routes
from ..http.fairgate import fair_gate_middleware
from ..http.lowlevel import answer_parser_errors_with_problems
from ..http.openapi import with_openapi
from ..http.policy import policy_middleware
from ..http.policy_cache import PolicySchema
from ..http.problems import problems_middleware
from ..http.ratelimit import rate_limit_middlewares
from ..http.state import GATEWAY, Gateway
from ..http.telemetry import telemetry_middleware
from ..settings import GatewaySettings
from ..ui.routes import add_ui_routes
from .credentials import REVOKED, credential_state, on_revoked

log = structlog.get_logger()

# every endpoint, in the order the OpenAPI document lists them, GET /openapi.json last
ENDPOINTS = with_openapi([
    *auth.ENDPOINTS, *tenants.ENDPOINTS, *ssh_keys.ENDPOINTS, *nodes.ENDPOINTS, *bmc.ENDPOINTS,
    *health.ENDPOINTS, *faults.ENDPOINTS,
    *pools.ENDPOINTS, *shapes.ENDPOINTS, *images.ENDPOINTS, *quotas.ENDPOINTS, *allocations.ENDPOINTS,
    *steps.ENDPOINTS, *events.ENDPOINTS,
    *power.ENDPOINTS, *console.ENDPOINTS, *wipes.ENDPOINTS, *ops.ENDPOINTS, *networks.ENDPOINTS,
    *storage_quotas.ENDPOINTS, *volumes.ENDPOINTS, *volume_attachments.ENDPOINTS, *clusters.ENDPOINTS, *jobs.ENDPOINTS,
    *spot.ENDPOINTS, *billing.ENDPOINTS, *invoices.ENDPOINTS, *budgets.ENDPOINTS,
    *api_keys.ENDPOINTS, *policies.ENDPOINTS, *rate_limits.ENDPOINTS,
    *audit.ENDPOINTS])
# the state reader of each PUT, PATCH and DELETE operation, by operationId (the audit middleware's)
STATE_READERS: dict[str, AuditState] = {e.operation_id: e.audit_state for e in ENDPOINTS if e.audit_state is not None}
# the Cedar schema of this route table and the operations policies judge (``judged``, by operationId): the policy
# middleware's and the policy routes', compiled once per process on first use
POLICY_SCHEMA = PolicySchema(ENDPOINTS)


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
    # — after the client's address behind the provider's proxies (http/clients.py), the shedder, which refuses a
    # flooding tenant's requests before all that work (http/ratelimit.py), and the fair gate, which bounds each
    # tenant's requests in progress (http/fairgate.py)
    shed, limit = rate_limit_middlewares(gw)
    app.middlewares.extend([client_address_middleware(config.trusted_proxies), shed,
                            fair_gate_middleware(gw, config.tenant_inflight), telemetry_middleware(rt.service),
                            audit_middleware(STATE_READERS), problems_middleware, auth_middleware(gw.tokens), limit,
                            policy_middleware(gw, POLICY_SCHEMA)])
    add_routes(app, ENDPOINTS)
    add_ui_routes(app)
    answer_parser_errors_with_problems(app)   # aiohttp's own answers to unparsable requests: problem+json too
    app.cleanup_ctx.append(_bootstrap_admin)
    app.cleanup_ctx.append(_listen)
    app.cleanup_ctx.append(credential_state)   # signing keys, revocation list (docs/credentials.md)
    rt.listen(REVOKED, on_revoked(gw))
    app.on_shutdown.append(gw.streams.close_all)
    return app
