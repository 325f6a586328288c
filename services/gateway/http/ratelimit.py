"""Per-tenant and per-user API rate limits, shared by every gateway replica (docs/rate-limits.md).

After authentication, before policy: a tenant member's request takes a token from its tenant's bucket and its own
(reads and writes apart), the token exchange one from its source address's; provider admins are not limited (they
are the operators who change the limits, and must get through a tenant's flood). Over a limit: 429
``rate-limited`` with ``Retry-After`` and the ``RateLimit-Policy`` / ``RateLimit`` headers, which every limited
answer carries too. One database statement per request; when the database cannot answer it the request goes on
unlimited (logged): the limiter protects the platform, it is not what keeps tenants apart.

A refusal is remembered by the replica until the refusing bucket holds a token again (``Refusals``): a flooding
tenant's further requests in that time are refused without a database statement. That is exact, not a guess:
tokens only come from time, so no replica's request could have got one before then. A flood then costs the
gateway little more than reading the token, which is what keeps the other tenants' latency (bench:noisy).
"""
from __future__ import annotations

import asyncio
import time

import asyncpg
import structlog
from aiohttp import web

from ..adapters import rate_limits as repo
from ..domain.rate_limits import Decision, Limit, RateClass, class_of
from .auth import PRINCIPAL, PUBLIC_PATHS
from .problems import ProblemError

log = structlog.get_logger()

RATE_LIMITED = "rate-limited"
# the 429's headers as the OpenAPI document states them (the RateLimit ones are absent where no bucket applies)
RATE_LIMITED_HEADERS = {
    "Retry-After": {"description": "Whole seconds until the request may succeed.", "required": True,
                    "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "RateLimit-Policy": {"description": "Each bucket's quota (q, its burst) and window (w, seconds to fill it), "
                                        "draft-ietf-httpapi-ratelimit-headers-10.", "schema": {"type": "string"}},
    "RateLimit": {"description": "Each bucket's remaining tokens (r) and seconds until it is full (t).",
                  "schema": {"type": "string"}},
}


class RateLimited(ProblemError):
    def __init__(self, d: Decision):
        bucket = d.limiting()
        which = f"the {bucket.name}'s {bucket.limit.per_s} a second (burst {bucket.limit.burst})" if bucket else "a limit"
        super().__init__(429, f"too many requests: over {which}; retry in {d.retry_after_s} s",
                         slug=RATE_LIMITED, title="Too many requests", headers=d.headers())


class Limits:
    """The settings' bucket sizes, by scope and class."""

    def __init__(self, config) -> None:
        c = config
        self.tenant = {"read": Limit(c.rate_tenant_read_per_s, c.rate_tenant_read_burst),
                       "write": Limit(c.rate_tenant_write_per_s, c.rate_tenant_write_burst)}
        self.user = {"read": Limit(c.rate_user_read_per_s, c.rate_user_read_burst),
                     "write": Limit(c.rate_user_write_per_s, c.rate_user_write_burst)}
        self.address = Limit(c.rate_token_per_s, c.rate_token_burst)


class Refusals:
    """Buckets known empty, by (bucket name, subject, class), until when (monotonic), with the refusal."""

    def __init__(self) -> None:
        self._until: dict[tuple[str, str, str], tuple[float, Decision]] = {}

    def remember(self, subjects: dict[str, str], cls: str, d: Decision) -> None:
        now = time.monotonic()
        for b in d.buckets:
            if b.tokens < 1 and b.name in subjects:
                self._until[(b.name, subjects[b.name], cls)] = (now + b.empty_for_s, d)
        if len(self._until) > 10_000:      # forget the expired (bounded memory under many tenants)
            self._until = {k: v for k, v in self._until.items() if v[0] > now}

    def refused(self, subjects: dict[str, str], cls: str) -> Decision | None:
        now = time.monotonic()
        for name, subject in subjects.items():
            held = self._until.get((name, subject, cls))
            if held is not None and held[0] > now:
                return held[1]
        return None


def _subjects(request: web.Request) -> dict[str, str] | None:
    """The buckets a request draws on, by name (None: not limited)."""
    principal = request.get(PRINCIPAL)
    if principal is None:
        return {"address": request.remote or "unknown"} if request.path in PUBLIC_PATHS else None
    if principal.is_provider_admin or principal.tenant_id is None:
        return None
    return {"tenant": str(principal.tenant_id), "user": str(principal.user_id)}


async def _decide(gw, limits: Limits, request: web.Request, cls: RateClass) -> Decision | None:
    """The buckets' answer for this request; None when it is not limited."""
    principal = request.get(PRINCIPAL)
    async with gw.pool.acquire() as conn:
        if principal is None:
            if request.path not in PUBLIC_PATHS or limits.address.unlimited:
                return None
            return await repo.take_address(conn, request.remote or "unknown", cls, limits.address)
        if principal.is_provider_admin or principal.tenant_id is None:
            return None
        return await repo.take_member(conn, principal.tenant_id, principal.user_id, cls, limits.tenant[cls],
                                      limits.user[cls])


def rate_limit_middleware(gw):
    limits = Limits(gw.config)
    refusals = Refusals()

    @web.middleware
    async def limit(request: web.Request, handler) -> web.StreamResponse:
        if not request.path.startswith("/v1/"):
            return await handler(request)
        cls, subjects = class_of(request.method), _subjects(request)
        if subjects is not None and (known := refusals.refused(subjects, cls)) is not None:
            raise RateLimited(known)           # the bucket is still empty: no statement needed to know it
        try:
            d = await _decide(gw, limits, request, cls)
        except (asyncpg.PostgresError, OSError, asyncio.TimeoutError) as exc:
            log.warning("gateway.rate_limit_unavailable", error=repr(exc))
            d = None
        if d is None:
            return await handler(request)
        if not d.allowed:
            refusals.remember(subjects or {}, cls, d)
            raise RateLimited(d)
        headers = d.headers()
        try:
            resp = await handler(request)
        except ProblemError as exc:
            exc.headers = {**headers, **exc.headers}
            raise
        if not resp.prepared:   # a stream has sent its headers already
            resp.headers.update(headers)
        return resp

    return limit
