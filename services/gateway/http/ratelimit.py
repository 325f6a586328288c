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
import random
import time

import asyncpg
import structlog
from aiohttp import web

from ..adapters import rate_limits as repo
from ..domain.model import Principal
from ..domain.rate_limits import Decision, Limit, RateClass, class_of
from .auth import PRINCIPAL, PUBLIC_PATHS, known_principal
from .problems import ProblemError, problem_response
from .telemetry import REQUESTS, route_of

log = structlog.get_logger()

RATE_LIMITED = "rate-limited"
HOLD_MAX_S = 1.0      # a held refusal is answered after at most this long (see Holds)
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

    def refused(self, subjects: dict[str, str], cls: str) -> tuple[float, Decision] | None:
        """(until when, the refusal) when one of the buckets is known empty now."""
        now, found = time.monotonic(), None
        for name, subject in subjects.items():
            held = self._until.get((name, subject, cls))
            if held is not None and held[0] > now and (found is None or held[0] > found[0]):
                found = held
        return found


class Holds:
    """Refusals held back, per tenant, until the refusing bucket has a token again (and a random part of that time
    again, at most ``HOLD_MAX_S`` in all), as nginx's limit_req delays the excess: a client that ignores
    Retry-After and asks again at once is answered no faster than its bucket fills, which is what makes a flood
    cheap for the replica (one sleeping coroutine per held request instead of a refusal every ~0.2 ms per
    connection). At most ``cap`` held per tenant per replica; past that the 429 is answered at once."""

    def __init__(self, cap: int) -> None:
        self.cap, self.held = cap, {}

    async def hold(self, tenant: str, until: float) -> None:
        # until the bucket has a token, then up to as long again at random: the held requests of a flood do not
        # all come back at the same instant (they would take the gateway's database connections at once)
        wait = min((until - time.monotonic()) * random.uniform(1.0, 2.0), HOLD_MAX_S)
        if wait <= 0 or self.held.get(tenant, 0) >= self.cap:
            return
        self.held[tenant] = self.held.get(tenant, 0) + 1
        try:
            await asyncio.sleep(wait)
        finally:
            self.held[tenant] -= 1
            if not self.held[tenant]:
                del self.held[tenant]


def _member(principal: Principal) -> dict[str, str] | None:
    if principal.is_provider_admin or principal.tenant_id is None:
        return None
    return {"tenant": str(principal.tenant_id), "user": str(principal.user_id)}


def _subjects(request: web.Request) -> dict[str, str] | None:
    """The buckets a request draws on, by name (None: not limited)."""
    principal = request.get(PRINCIPAL)
    if principal is None:
        return {"address": request.remote or "unknown"} if request.path in PUBLIC_PATHS else None
    return _member(principal)


class ShedCount:
    """Requests refused before any other work, counted per tenant and logged at most once per ``every_s``, by the
    first refusal after that time (an access line per refused request would cost the gateway more than the
    refusal; the HTTP metrics count every one at once)."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s, self.counts, self.since = every_s, {}, time.monotonic()

    def add(self, tenant: str) -> None:
        self.counts[tenant] = self.counts.get(tenant, 0) + 1
        now = time.monotonic()
        if now - self.since >= self.every_s:
            for t, n in self.counts.items():
                log.info("http.rate_limited", tenant_id=t, refused=n, seconds=round(now - self.since, 1))
            self.counts, self.since = {}, now


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


def rate_limit_middlewares(gw) -> tuple:
    """(shed, limit): ``limit`` runs after authentication and takes tokens; ``shed`` runs before everything else
    (telemetry, audit, the token's signature) and refuses a request whose token this replica has authenticated
    before and whose bucket ``limit`` found empty, with the same 429, held until that bucket has a token again
    (``Holds``) — so a flooding tenant costs the gateway little more than parsing its requests, and the others'
    requests do not wait behind that work (bench:noisy). Its refusals are counted in the HTTP metrics and logged
    per tenant every 10 s."""
    limits = Limits(gw.config)
    refusals = Refusals()
    shed_count = ShedCount()
    holds = Holds(gw.config.rate_hold_refusals)

    @web.middleware
    async def shed(request: web.Request, handler) -> web.StreamResponse:
        path = request.path
        if path.startswith("/v1/") and path not in PUBLIC_PATHS:
            principal = known_principal(gw.tokens, request)
            subjects = _member(principal) if principal is not None else None
            if subjects is not None and (known := refusals.refused(subjects, class_of(request.method))) is not None:
                shed_count.add(subjects["tenant"])
                REQUESTS.labels(gw.rt.service, request.method, route_of(request), "429").inc()
                await holds.hold(subjects["tenant"], known[0])
                return problem_response(RateLimited(known[1]), request.rel_url.raw_path)
        return await handler(request)

    @web.middleware
    async def limit(request: web.Request, handler) -> web.StreamResponse:
        if not request.path.startswith("/v1/"):
            return await handler(request)
        cls, subjects = class_of(request.method), _subjects(request)
        if subjects is not None and (known := refusals.refused(subjects, cls)) is not None:
            raise RateLimited(known[1])        # the bucket is still empty: no statement needed to know it
        try:
            d = await _decide(gw, limits, request, cls)
        except (TimeoutError, asyncpg.PostgresError, OSError) as exc:
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

    return shed, limit
