"""Policy enforcement on every mutating route, before the handler runs (so before any command is sent and before
anything is written): the request becomes a Cedar request (domain.policy), decided under the provider's policies
and the caller's tenant's; a denial is a 403 ``policy-denied`` naming the policy and its reason, recorded by the
audit middleware (outside this one) like any failed mutation.

The request's resource: the endpoint's own ``policy_resource`` builder for an operation that has a resource type
of its own (domain.policy.OPERATION_RESOURCE), the generic Target for the others (path parameters and top-level
scalar body fields as tags). A builder answers None when the request cannot be judged because it is not a valid
request (a body that does not parse or validate, an unknown shape or image): the handler then answers it with its
own 4xx, creating nothing. Policies judge well-formed requests only.

Not judged: ``POST /v1/auth/token`` (how one signs in), the policy routes themselves (a policy must never lock its
admins out of fixing it), and requests that are not valid (the handler answers those with their 4xx).

The policies are cached per process (http/policy_cache.py): compiled once, dropped when ``gateway.policy_changed``
arrives (every replica subscribes to its subject on core NATS, not as a durable consumer: each must see every
change) or when the replica changes a policy itself, and reloaded after POLICY_TTL_S anyway, in case an event was
missed.
"""
from __future__ import annotations

import structlog
from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from ..domain.policy import OPERATION_RESOURCE, Caller, Decision, Resource
from .auth import PRINCIPAL, PUBLIC_PATHS
from .endpoint import Endpoint
from .inputs import VALID_BODY, read_json_object
from .policy_cache import MUTATING, PolicyCache, PolicySchema
from .problems import ProblemError
from .schema_base import Problem
from .state import Gateway

log = structlog.get_logger()

CHANGED = "gateway.policy_changed"
_SCALARS = (str, int, float, bool)


class PolicyDeniedProblem(Problem):
    """A 403 policy-denied: the policy that forbids the request (by name and by id) and why."""

    policy_id: str = Field(description="The forbidding policy's id (a stored policy's UUID, a default's @id).")
    policy_name: str = Field(description="What its author calls it: its @id annotation, or policy_id when it has "
                                         "none. The detail names the policy by it.")
    reason: str


class PolicyDenied(ProblemError):
    def __init__(self, decision: Decision):
        name = decision.policy_name or decision.policy_ids[0]
        super().__init__(403, f"denied by policy {name}: {decision.reason}", slug="policy-denied",
                         title="Denied by policy")
        self.policy_id, self.policy_name, self.reason = decision.policy_ids[0], name, decision.reason or ""

    def to_problem(self, instance: str | None = None) -> PolicyDeniedProblem:
        return PolicyDeniedProblem(**super().to_problem(instance).model_dump(), policy_id=self.policy_id,
                                   policy_name=self.policy_name, reason=self.reason)


def cache_of(gw: Gateway) -> PolicyCache:
    """The gateway's policy cache (made by policy_middleware)."""
    if gw.policy_cache is None:
        raise RuntimeError("the policy middleware is not installed")
    return gw.policy_cache


def caller_of(principal) -> Caller:
    return Caller(principal.user_id, principal.role, principal.tenant_id)


async def body_of(request: web.Request, endpoint: Endpoint) -> tuple[dict, BaseModel | None] | None:
    """The JSON body and its parsed model ({} and None for a route without a body); None when it is not valid."""
    if endpoint.body is None:
        return {}, None
    try:
        data = await read_json_object(request)   # read once: the handler gets the same body (or the same error)
    except ProblemError:
        return None                              # the handler answers it (400, 413, 415, 422)
    try:
        model = endpoint.body.model_validate({k: v for k, v in data.items() if k not in endpoint.body.server_owned})
    except (ValueError, ValidationError):
        return None
    request[VALID_BODY] = (endpoint.body, model)
    return data, model


def tags(request: web.Request, data: dict) -> dict[str, str]:
    """A resource's tags: the top-level scalar body fields and the path parameters."""
    found = {k: str(v).lower() if isinstance(v, bool) else str(v)
             for k, v in data.items() if isinstance(v, _SCALARS) and v is not None}
    found.update(request.match_info)
    return found


async def resource_of(request: web.Request, endpoint: Endpoint) -> Resource | None:
    """The policy resource of this request, or None when it is not valid (see the module's docstring)."""
    parsed = await body_of(request, endpoint)
    if parsed is None:
        return None
    data, body = parsed
    op = endpoint.operation_id
    kind = OPERATION_RESOURCE.get(op, "Target")
    if kind != "Target" and endpoint.policy_resource is not None:
        built = await endpoint.policy_resource(request, data, body)
    else:
        built = {"method": request.method, "path": request.path}, tags(request, data)
    return None if built is None else Resource(op, kind, *built)


def policy_middleware(gw: Gateway, schema: PolicySchema):
    """The middleware judging the operations ``schema`` judges (the route table's); it also gives ``gw`` its
    PolicyCache and registers the cache's listener with the runtime (started with it, after NATS is connected)."""
    cache = PolicyCache(schema, lambda: gw.pool)
    gw.policy_cache = cache
    gw.rt.listen(CHANGED, cache.on_change)

    @web.middleware
    async def enforce(request: web.Request, handler) -> web.StreamResponse:
        if request.method not in MUTATING or not request.path.startswith("/v1/") or request.path in PUBLIC_PATHS:
            return await handler(request)
        principal = request.get(PRINCIPAL)
        endpoint = schema.judged.get(request.match_info.route.name or "")
        if principal is None or endpoint is None:
            return await handler(request)
        resource = await resource_of(request, endpoint)
        if resource is not None:
            decision = (await cache.book()).decide(caller_of(principal), resource)
            if not decision.allowed:
                log.info("gateway.policy_denied", operation=endpoint.operation_id, policy_ids=decision.policy_ids)
                raise PolicyDenied(decision)
        return await handler(request)

    return enforce
