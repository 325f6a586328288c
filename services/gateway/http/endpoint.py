"""The route table: each endpoint once, read both by the router and by the OpenAPI generator."""
from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, TypeAdapter

from .schema_base import ApiJsonSchema, Problem

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# (request, its JSON body, the parsed body model or None) -> the policy resource's (attributes, tags), or None when
# the request is not valid (http/policy.py)
PolicyResource = Callable[[web.Request, dict, Any], Awaitable[tuple[dict, dict] | None]]
# (connection, path parameters, principal) -> the target's state as JSON, or None when there is none
# (http/audit.py; adapters/audit_state.py)
AuditState = Callable[[Any, dict[str, str], Any], Awaitable[dict | None]]
EVENT_STREAM = "text/event-stream"
TEXT_PLAIN = "text/plain"
TEXT_HTML = "text/html"
TEXT_CSV = "text/csv"
NDJSON = "application/x-ndjson"


@dataclass(frozen=True, eq=False)
class Param:
    """A path, query or header parameter. ``type`` (a pydantic type: ``uuid.UUID``, ``ShapeName``, ``integer(1, 100)``)
    is what ``http.inputs`` validates the value with and what the OpenAPI document shows as its schema."""

    name: str
    location: Literal["query", "header", "path"]
    description: str
    type: Any = str
    required: bool = False
    default: Any = None

    @functools.cached_property
    def adapter(self) -> TypeAdapter:
        return TypeAdapter(self.type)

    @functools.cached_property
    def schema(self) -> dict:
        schema = self.adapter.json_schema(schema_generator=ApiJsonSchema)
        if self.default is not None:
            schema["default"] = self.default
        return schema

    @property
    def is_integer(self) -> bool:
        return self.schema.get("type") == "integer"


@dataclass(frozen=True)
class Endpoint:
    """One operation. ``responses`` maps a status to a model, or to a media type (EVENT_STREAM, TEXT_PLAIN), or to
    None (no body).

    Error responses (problem+json) are added by the generator from ``errors``: a ``Problem`` unless ``problems``
    names the problem models (with extension members) that status may carry. ``headers``: status -> the response
    headers it always carries -> their description. ``policy_resource`` and ``audit_state``: what the policy and
    audit middlewares read of this operation's requests (neither is part of the OpenAPI document).
    """

    method: str
    path: str
    handler: Handler
    operation_id: str
    summary: str
    tag: str
    responses: dict[int, type[BaseModel] | str | None]
    body: type[BaseModel] | None = None
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = ()
    security: Literal["bearer", "api_key", "none"] = "bearer"
    description: str = ""
    problems: dict[int, tuple[type[Problem], ...]] = field(default_factory=dict)
    headers: dict[int, dict[str, str]] = field(default_factory=dict)
    # what a policy judges of a request, for an operation with a resource type of its own (http/policy.py)
    policy_resource: PolicyResource | None = field(default=None, compare=False)
    # the target's state before and after, for a PUT, PATCH or DELETE (http/audit.py)
    audit_state: AuditState | None = field(default=None, compare=False)


def add_routes(app: web.Application, endpoints: list[Endpoint]) -> None:
    """The route table on ``app``: each operation, then for each path a route answering every other method with a
    405 whose Allow lists that path's methods.

    aiohttp gives each named route a resource of its own and answers a method none of them takes with the union
    of the methods of every resource matching the path: /v1/policies/evaluate (POST) also matches
    /v1/policies/{policy_id} (GET, PUT, DELETE), so its 405 listed all four. The path's own catch-all is reached
    first (aiohttp tries the longest literal prefix first, then the order of registration), so a path's 405 is its
    own methods only, and a method a literal path does not take is a 405 there, never another path's route."""
    methods: dict[str, list[str]] = {}
    for e in endpoints:
        app.router.add_route(e.method, e.path, e.handler, name=e.operation_id)
        methods.setdefault(e.path, []).append(e.method)
    for path, allowed in methods.items():
        app.router.add_route("*", path, functools.partial(_method_not_allowed, frozenset(allowed)))


async def _method_not_allowed(allowed: frozenset[str], request: web.Request) -> web.StreamResponse:
    raise web.HTTPMethodNotAllowed(request.method, allowed)


def respond(model: BaseModel, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response from a response model (the same model the OpenAPI document names)."""
    return web.Response(status=status, text=model.model_dump_json(), content_type="application/json", headers=headers)
