"""What a mutating request asks, as the policy schema's resource (domain.policy): one builder per operation that
has a resource type of its own, the generic Target for the others (path parameters and top-level scalar body
fields as tags).

A builder returns None when the request cannot be judged because it is not a valid request (a body that does not
parse or validate, an unknown shape or image): the handler then answers it with its own 4xx, creating nothing.
Policies judge well-formed requests only.
"""
from __future__ import annotations


from aiohttp import web
from pydantic import BaseModel, ValidationError

from ..domain.policy import OPERATION_RESOURCE, Resource
from ..domain.scheduling import DEFAULT_POOL
from .auth import principal_of
from .endpoint import Endpoint
from .inputs import read_json_object
from .problems import ProblemError
from .state import Gateway

_SCALARS = (str, int, float, bool)


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
    return data, model


def _tags(request: web.Request, data: dict) -> dict[str, str]:
    tags = {k: str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in data.items() if isinstance(v, _SCALARS) and v is not None}
    tags.update(request.match_info)
    return tags


async def _allocation(gw: Gateway, request: web.Request, data: dict, body) -> tuple[dict, dict] | None:
    from ..api.inventory.images import resolve_image   # here: the handlers import the http package
    from ..api.inventory.shapes import known_shapes
    async with gw.pool.acquire() as conn:
        shape = (await known_shapes(conn)).get(body.shape)
        if shape is None:
            return None
        try:
            image = await resolve_image(conn, principal_of(request), body.image)
        except ProblemError:
            return None
    attrs = {"name": body.name, "shape": shape.name, "gpu_count": shape.gpu_count, "pool": body.pool or DEFAULT_POOL,
             "image_approved": True, "spot": body.spot, "privileged": data.get("privileged") is True,
             "priority_class": body.priority_class}
    if shape.gpu_model:
        attrs["gpu_model"] = shape.gpu_model
    if image is not None:
        attrs["image"] = image["name"]
    return attrs, {str(k): str(v) for k, v in body.labels.items()}   # an allocation's tags are its labels


def _volume(request: web.Request, data: dict, body) -> tuple[dict, dict]:
    attrs = {"name": body.name, "size_bytes": body.size_bytes, "shared": body.shared}
    if body.storage_class:
        attrs["storage_class"] = body.storage_class
    return attrs, _tags(request, data)


def _attachment(request: web.Request, data: dict, body) -> tuple[dict, dict]:
    return ({"volume_id": request.match_info["volume_id"], "allocation_id": str(body.allocation_id),
             "mode": body.mode}, _tags(request, data))


def _power(request: web.Request, data: dict) -> tuple[dict, dict]:
    return ({"allocation_id": request.match_info["allocation_id"], "action": request.match_info["action"]},
            _tags(request, data))


async def resource_of(gw: Gateway, request: web.Request, endpoint: Endpoint) -> Resource | None:
    """The policy resource of this request, or None when it is not valid (see the module's docstring)."""
    parsed = await body_of(request, endpoint)
    if parsed is None:
        return None
    data, body = parsed
    op = endpoint.operation_id
    kind = OPERATION_RESOURCE.get(op, "Target")
    if kind == "Allocation":
        built = await _allocation(gw, request, data, body)
    elif kind == "Volume":
        built = _volume(request, data, body)
    elif kind == "VolumeAttachment":
        built = _attachment(request, data, body)
    elif kind == "PowerAction":
        built = _power(request, data)
    else:
        built = {"method": request.method, "path": request.path}, _tags(request, data)
    return None if built is None else Resource(op, kind, *built)
