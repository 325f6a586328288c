"""The OpenAPI 3.1 document of a route table, generated from its endpoints and their pydantic models.

The gateway's route table is gathered in entrypoints/http.py, which serves it at GET /openapi.json
(``with_openapi``); it is committed at contracts/openapi.json: regenerate with
``python -m services.gateway.entrypoints.openapi > contracts/openapi.json`` (a test keeps them equal).
"""
from __future__ import annotations

import functools
import json
import re

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .endpoint import EVENT_STREAM, NDJSON, TEXT_CSV, TEXT_HTML, TEXT_PLAIN, Endpoint, Param
from .policy import PolicyDeniedProblem
from .policy_cache import MUTATING, NOT_JUDGED
from .problems import _TITLES, PROBLEM_JSON
from .ratelimit import RATE_LIMITED_HEADERS
from .schema_base import ApiJsonSchema, Problem

_REF = "#/components/schemas/{model}"
_SECURITY = {"bearer": [{"bearerAuth": []}], "api_key": [{"apiKey": []}], "none": []}


def with_openapi(api: list[Endpoint]) -> list[Endpoint]:
    """``api`` and, last, GET /openapi.json: the document of that whole list (built and rendered at its first
    request, then served as it is: the route table does not change while the process runs)."""
    endpoints: list[Endpoint] = []

    @functools.cache
    def text() -> str:
        return json.dumps(document(endpoints))

    async def serve_openapi(_request: web.Request) -> web.Response:
        return web.Response(text=text(), content_type="application/json")

    endpoints += [*api, Endpoint("GET", "/openapi.json", serve_openapi, "getOpenApi", "This OpenAPI document", "meta",
                                 {200: "application/json"}, security="none")]
    return endpoints


def _judged(e: Endpoint) -> bool:
    """Whether policy may refuse the operation (http/policy.py: every mutating /v1 operation but a few)."""
    return e.method in MUTATING and e.path.startswith("/v1/") and e.operation_id not in NOT_JUDGED


def _models(endpoints: list[Endpoint]) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = [Problem, PolicyDeniedProblem]
    for e in endpoints:
        for m in [e.body, *e.responses.values(), *(m for ms in e.problems.values() for m in ms)]:
            if isinstance(m, type) and issubclass(m, BaseModel) and m not in found:
                found.append(m)
    return found


def _param(p: Param) -> dict:
    return {"name": p.name, "in": p.location, "description": p.description, "required": p.required or p.location == "path",
            "schema": p.schema}


def _headers(described: dict[str, str]) -> dict:
    return {name: {"description": text, "required": True, "schema": {"type": "string"}} for name, text in described.items()}


def _response(target, ref) -> dict:
    if target is None:
        return {"description": "No content"}
    if isinstance(target, str):
        described = {EVENT_STREAM: "Server-sent events", TEXT_PLAIN: "Text", TEXT_HTML: "An HTML document",
                     TEXT_CSV: "CSV (RFC 4180, a header row)", NDJSON: "JSON lines: one JSON object per line"}
        return {"description": described.get(target, "Document"),
                "content": {target: {"schema": {"type": "string"} if target in described else {"type": "object"}}}}
    return {"description": target.__doc__.strip().splitlines()[0] if target.__doc__ else target.__name__,
            "content": {"application/json": {"schema": ref(target)}}}


def _problem(status: int, models: tuple[type[Problem], ...], ref) -> dict:
    schema = ref(models[0]) if len(models) == 1 else {"anyOf": [ref(m) for m in models]}
    return {"description": _TITLES.get(status, "Error"), "content": {PROBLEM_JSON: {"schema": schema}}}


def _operation(e: Endpoint, ref) -> dict:
    op = {"operationId": e.operation_id, "summary": e.summary, "tags": [e.tag], "security": _SECURITY[e.security]}
    if e.description:
        op["description"] = e.description
    if e.params:
        op["parameters"] = [_param(p) for p in e.params]
    if e.body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(e.body)}}}
    responses = {str(status): _response(target, ref) for status, target in e.responses.items()}
    limited = e.path.startswith("/v1/")     # every API operation may be refused for its rate (http/ratelimit.py)
    problems = dict(e.problems)
    errors = list(e.errors)
    if _judged(e):                          # and every judged one by a policy (a 403 naming it)
        problems[403] = (*problems.get(403, (Problem,)), PolicyDeniedProblem)
        errors += [] if 403 in errors else [403]
    for status in (*errors, *((429,) if limited else ()), 500):
        responses[str(status)] = _problem(status, problems.get(status, (Problem,)), ref)
    if limited:
        responses["429"].update(description="Too many requests", headers=RATE_LIMITED_HEADERS)
    if 401 in e.errors:
        responses["401"]["headers"] = _headers({"WWW-Authenticate": "The scheme to authenticate with."})
    for status, described in e.headers.items():
        responses[str(status)]["headers"] = _headers(described)
    op["responses"] = responses
    return op


def _singular(segment: str) -> str:
    word = segment.rsplit("-", 1)[-1]
    return word[:-3] + "y" if word.endswith("ies") else word[:-1] if word.endswith("s") else word


def _links(paths: dict[str, dict], schemas: dict) -> None:
    """OpenAPI links, for a client (and the stateful contract test) to follow: the 2xx of a POST that creates an
    item of a collection links to every operation on that item (``<collection>/{x_id}…``, its id from the answer's
    ``id``; ``…/{name}`` from its ``name``), the collection's own path parameters passed on from the request."""
    for path, ops in paths.items():
        post = ops.get("post")
        if post is None:
            continue
        status = next((s for s in post["responses"] if s.startswith("2")), None)
        ref = (post["responses"][status].get("content", {}).get("application/json", {}).get("schema", {})
               .get("$ref", "") if status else "")
        fields = schemas.get(ref.rsplit("/", 1)[-1], {}).get("properties", {})
        links: dict[str, dict] = {}
        item = re.compile(re.escape(path) + r"/\{(\w+)\}(/|$)")
        for target, target_ops in paths.items():
            m = item.match(target)
            if m is None:
                continue
            param = m.group(1)
            source = ("id" if param == f"{_singular(path.rsplit('/', 1)[1])}_id" and "id" in fields
                      else "name" if param == "name" and "name" in fields else None)
            if source is None:
                continue
            carried = {p: f"$request.path.{p}" for p in re.findall(r"\{(\w+)\}", path)}
            for op in target_ops.values():
                links[op["operationId"]] = {"operationId": op["operationId"],
                                            "parameters": {**carried, param: f"$response.body#/{source}"}}
        if links:
            post["responses"][status]["links"] = dict(sorted(links.items()))


def document(endpoints: list[Endpoint]) -> dict:
    """The whole document of ``endpoints`` (pure; building it takes a while: a caller keeps what it needs again)."""
    mapping, top = models_json_schema([(m, "validation") for m in _models(endpoints)], ref_template=_REF,
                                      schema_generator=ApiJsonSchema)

    def ref(model: type[BaseModel]) -> dict:
        return mapping[(model, "validation")]

    paths: dict[str, dict] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e, ref)
    _links(paths, top.get("$defs", {}))
    return {
        "openapi": "3.1.0",
        "info": {"title": "Tessera API", "version": "1.0.0",
                 "description": "Tessera's HTTP API: identity, nodes, allocations and operator views. Errors are "
                                "RFC 9457 problem details (application/problem+json)."},
        "paths": paths,
        "components": {
            "schemas": top.get("$defs", {}),
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "Authorization",
                           "description": "`Authorization: ApiKey tsk_...`, only for POST /v1/auth/token."},
            },
        },
    }


def render(endpoints: list[Endpoint]) -> str:
    """The document as committed (contracts/openapi.json)."""
    return json.dumps(document(endpoints), indent=2) + "\n"
