"""Reading client input: JSON bodies (type, size, syntax, server-owned fields, schema), query and path values.

Every refusal raises a ProblemError before anything is written, so bad input never
leaves partial state.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import TypeVar

from aiohttp import web
from pydantic import ValidationError

from services.scheduler.contracts import NAME

from .problems import ProblemError, field_errors, not_found, validation_problem
from .schemas.base import Body, FieldError

MAX_BODY_BYTES = 64 * 1024
B = TypeVar("B", bound=Body)


def _is_json(content_type: str) -> bool:
    return content_type == "application/json" or (content_type.startswith("application/") and content_type.endswith("+json"))


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


async def _read_limited(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise ProblemError(413, f"the body exceeds {MAX_BODY_BYTES} bytes")
    chunks, size = [], 0
    while chunk := await request.content.read(16384):
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ProblemError(413, f"the body exceeds {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(request: web.Request) -> dict:
    """The body as a JSON object. Raises 415 (not JSON), 413 (over 64 KiB), 400 (not parseable), 422 (not an object)."""
    if not _is_json(request.content_type):
        raise ProblemError(415, f"send application/json, not {request.content_type or 'nothing'}")
    if request.charset not in (None, "utf-8", "utf8"):
        raise ProblemError(415, "JSON bodies must be UTF-8")
    raw = await _read_limited(request)
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProblemError(400, f"the body is not valid JSON: {str(exc)[:200]}", slug="malformed-json") from None
    if not isinstance(data, dict):
        raise validation_problem([FieldError(field="body", message="must be a JSON object", code="object_type")])
    return data


async def read_body(request: web.Request, model: type[B]) -> B:
    """Parse and validate a request body as ``model``; raises ProblemError (400/413/415/422)."""
    data = await read_json_object(request)
    errors = [FieldError(field=k, message="server-owned field: Tessera sets it, a client cannot", code="server_owned")
              for k in sorted(model.server_owned & data.keys())]
    try:
        parsed = model.model_validate({k: v for k, v in data.items() if k not in model.server_owned})
    except ValidationError as exc:
        errors += field_errors(exc)
        parsed = None
    if errors:
        owned = [e.field for e in errors if e.code == "server_owned"]
        detail = f"server-owned field(s) cannot be set: {', '.join(owned)}" if owned else None
        raise validation_problem(errors, detail)
    return parsed


def query_int(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter within [lo, hi]; raises a 422 naming it otherwise."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise validation_problem([FieldError(field=name, message=f"must be an integer from {lo} to {hi}", code="query")])
    return value


def path_uuid(request: web.Request, name: str, what: str) -> uuid.UUID:
    """A UUID path parameter; a malformed one is simply an unknown resource (404)."""
    try:
        return uuid.UUID(request.match_info[name])
    except ValueError:
        raise not_found(what) from None


def path_name(request: web.Request, param: str = "name") -> str:
    """A pool or shape name from the path; 422 naming the parameter when it is not a valid name."""
    value = request.match_info[param]
    if not re.match(NAME, value):
        raise validation_problem([FieldError(field=param, message="lower-case letters, digits, '.' and '-' (at most 63)",
                                             code="path")])
    return value
