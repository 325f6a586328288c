"""The route table: each endpoint once, read both by the router and by the OpenAPI generator."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable, Literal

from aiohttp import web
from pydantic import BaseModel

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
EVENT_STREAM = "text/event-stream"


@dataclass(frozen=True)
class Param:
    name: str
    location: Literal["query", "header", "path"]
    description: str
    schema: dict = field(default_factory=lambda: {"type": "string"})
    required: bool = False


@dataclass(frozen=True)
class Endpoint:
    """One operation. ``responses`` maps a status to a model, or to EVENT_STREAM, or to None (no body).

    Error responses (problem+json) are added by the generator from ``errors``.
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


def add_routes(app: web.Application, endpoints: list[Endpoint]) -> None:
    for e in endpoints:
        app.router.add_route(e.method, e.path, e.handler, name=e.operation_id)


def respond(model: BaseModel, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response from a response model (the same model the OpenAPI document names)."""
    return web.Response(status=status, text=model.model_dump_json(), content_type="application/json", headers=headers)
