"""Policy enforcement on every mutating route, before the handler runs (so before any command is sent and before
anything is written): the request becomes a Cedar request (domain.policy; its resource: http.policy_resources),
decided under the provider's policies and the caller's tenant's; a denial is a 403 ``policy-denied`` naming the
policy and its reason, recorded by the audit middleware (outside this one) like any failed mutation.

Not judged: ``POST /v1/auth/token`` (how one signs in), the policy routes themselves (a policy must never lock its
admins out of fixing it), and requests that are not valid (the handler answers those with their 4xx).

The policies are cached per process (``PolicyCache``): compiled once, dropped when ``gateway.policy_changed``
arrives (every replica subscribes to its subject on core NATS, not as a durable consumer: each must see every
change) or when the replica changes a policy itself, and reloaded after POLICY_TTL_S anyway, in case an event was
missed.
"""
from __future__ import annotations

import asyncio
import time

import cedarpy
import structlog
from aiohttp import web

from ..domain import policy as domain
from ..domain.policy import Caller, Decision, Policy, PolicyBook
from .auth import PRINCIPAL, PUBLIC_PATHS
from .endpoint import Endpoint
from .policy_resources import resource_of
from .problems import ProblemError
from .schema_base import Problem
from .state import Gateway

log = structlog.get_logger()

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
NOT_JUDGED = frozenset({"createToken", "createPolicy", "replacePolicy", "deletePolicy", "evaluatePolicy"})
POLICY_TTL_S = 30.0
CHANGED = "gateway.policy_changed"


class PolicyDeniedProblem(Problem):
    """A 403 policy-denied: the policy that forbids the request and why."""

    policy_id: str
    reason: str


class PolicyDenied(ProblemError):
    def __init__(self, decision: Decision):
        super().__init__(403, f"denied by policy {decision.policy_ids[0]}: {decision.reason}", slug="policy-denied",
                         title="Denied by policy")
        self.policy_id, self.reason = decision.policy_ids[0], decision.reason or ""

    def to_problem(self, instance: str | None = None) -> PolicyDeniedProblem:
        return PolicyDeniedProblem(**super().to_problem(instance).model_dump(), policy_id=self.policy_id,
                                   reason=self.reason)


def mutating_endpoints() -> dict[str, Endpoint]:
    """The judged operations, by operationId (the route table, read on first use: it imports every handler)."""
    from .openapi import ENDPOINTS
    return {e.operation_id: e for e in ENDPOINTS if e.method in MUTATING and e.operation_id not in NOT_JUDGED}


class PolicySchema:
    """The Cedar schema of this gateway's route table, and the default provider policies (built on first use)."""

    _built: tuple[str, cedarpy.Schema, list[Policy]] | None = None

    @classmethod
    def get(cls) -> tuple[str, cedarpy.Schema, list[Policy]]:
        if cls._built is None:
            ops = [domain.operation(e.operation_id, e.tag) for e in mutating_endpoints().values()]
            text = domain.schema_text(ops)
            schema = cedarpy.Schema.from_str(text)
            cls._built = (text, schema, domain.load_defaults(schema))
        return cls._built


def stored_policy(row) -> Policy:
    """A stored policy row as the book holds it (its text was checked when stored)."""
    return Policy(str(row["id"]), row["scope"], row["tenant_id"], domain.parse_one(row["text"]))


class PolicyCache:
    """The compiled policies of this process: reloaded from the database when invalidated or older than ttl_s."""

    def __init__(self, gw: Gateway, ttl_s: float = POLICY_TTL_S):
        self.gw, self.ttl_s = gw, ttl_s
        self._book: PolicyBook | None = None
        self._loaded_at = 0.0
        self._generation = 0
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        self._generation += 1
        self._book = None

    async def book(self) -> PolicyBook:
        book = self._book
        if book is not None and time.monotonic() - self._loaded_at < self.ttl_s:
            return book
        async with self._lock:
            if self._book is not None and time.monotonic() - self._loaded_at < self.ttl_s:
                return self._book
            generation, started = self._generation, time.monotonic()
            from ..adapters import policies as repo
            async with self.gw.pool.acquire() as conn:
                rows = await repo.enabled(conn)
            _, schema, defaults = PolicySchema.get()
            book = PolicyBook(schema, defaults + [stored_policy(r) for r in rows])
            if generation == self._generation:   # no change was announced while reading: keep it
                self._book, self._loaded_at = book, started
            return book

    async def on_change(self, msg) -> None:
        """A ``gateway.policy_changed``, heard by every replica (Runtime.listen): drop the cache."""
        self.invalidate()
        log.debug("gateway.policies_invalidated", subject=msg.subject)


def cache_of(gw: Gateway) -> PolicyCache:
    """The gateway's policy cache (made by policy_middleware)."""
    if gw.policy_cache is None:
        raise RuntimeError("the policy middleware is not installed")
    return gw.policy_cache


def caller_of(principal) -> Caller:
    return Caller(principal.user_id, principal.role, principal.tenant_id)


def policy_middleware(gw: Gateway):
    """The middleware; it also gives ``gw`` its PolicyCache and registers the cache's listener with the runtime
    (started with it, after NATS is connected)."""
    cache = PolicyCache(gw)
    gw.policy_cache = cache
    gw.rt.listen(CHANGED, cache.on_change)
    judged: dict[str, Endpoint] = {}

    @web.middleware
    async def enforce(request: web.Request, handler) -> web.StreamResponse:
        if request.method not in MUTATING or not request.path.startswith("/v1/") or request.path in PUBLIC_PATHS:
            return await handler(request)
        principal = request.get(PRINCIPAL)
        name = request.match_info.route.name
        if not judged:
            judged.update(mutating_endpoints())
        endpoint = judged.get(name or "")
        if principal is None or endpoint is None:
            return await handler(request)
        resource = await resource_of(gw, request, endpoint)
        if resource is not None:
            decision = (await cache.book()).decide(caller_of(principal), resource)
            if not decision.allowed:
                log.info("gateway.policy_denied", operation=endpoint.operation_id, policy_ids=decision.policy_ids)
                raise PolicyDenied(decision)
        return await handler(request)

    return enforce
