"""Reading client input: JSON bodies (type, size, nesting, syntax, server-owned fields, schema), and path, query and
header values (each validated with its ``Param``'s type, the one the OpenAPI document shows).

Every refusal raises a ProblemError before anything is written, so bad input never
leaves partial state.
"""
from __future__ import annotations

import json
import re
import uuid
from itertools import accumulate
from typing import Any, TypeVar

from aiohttp import web
from pydantic import ValidationError

from .endpoint import Param
from .problems import ProblemError, field_errors, not_found, validation_problem
from .schema_base import Body, FieldError

MAX_BODY_BYTES = 64 * 1024
# the parsed JSON body, as the handler read it (the audit middleware records a PUT/PATCH body from it)
JSON_BODY = web.RequestKey("json_body", dict)
# why the body could not be read, once it was tried (the policy middleware reads it before the handler does)
BODY_ERROR = web.RequestKey("body_error", ProblemError)
# the body validated as its route's model, when the policy middleware did it (the handler's read_body reuses it)
VALID_BODY = web.RequestKey("valid_body", tuple)
MAX_JSON_DEPTH = 32
B = TypeVar("B", bound=Body)

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_INTEGER = re.compile(r"-?[0-9]{1,18}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _is_json(content_type: str) -> bool:
    return content_type == "application/json" or (content_type.startswith("application/") and content_type.endswith("+json"))


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def json_depth(raw: bytes) -> int:
    """How deeply arrays and objects nest in ``raw`` (linear; brackets inside strings do not count)."""
    brackets = _BRACKET.findall(_STRING.sub(b'""', raw))
    return max(accumulate(_DEPTH_STEP[b[0]] for b in brackets), default=0)


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


def _malformed(detail: str) -> ProblemError:
    return ProblemError(400, f"the body is not valid JSON: {detail[:200]}", slug="malformed-json")


async def read_json_object(request: web.Request) -> dict:
    """The body as a JSON object. Raises 415 (not JSON), 413 (over 64 KiB), 400 (not parseable, or nested deeper
    than MAX_JSON_DEPTH), 422 (not an object). Read once per request: a second call answers the same (the body, or
    the same error), so the policy middleware and the handler both read it."""
    if JSON_BODY in request:
        return request[JSON_BODY]
    if BODY_ERROR in request:
        raise request[BODY_ERROR]
    try:
        return await _read_json_object(request)
    except ProblemError as exc:
        request[BODY_ERROR] = exc
        raise


async def _read_json_object(request: web.Request) -> dict:
    if not _is_json(request.content_type):
        raise ProblemError(415, f"send application/json, not {request.content_type or 'nothing'}")
    if request.charset not in (None, "utf-8", "utf8"):
        raise ProblemError(415, "JSON bodies must be UTF-8")
    raw = await _read_limited(request)
    # json's decoder recurses once per level: a few tens of KB of '[' exhaust the stack (RecursionError). No body
    # of this API nests more than a few levels, so anything deeper is refused before decoding.
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise ProblemError(400, f"JSON nesting deeper than {MAX_JSON_DEPTH} levels", slug="json-too-deep")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        raise ProblemError(400, f"JSON nesting deeper than {MAX_JSON_DEPTH} levels", slug="json-too-deep") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise _malformed(str(exc)) from None
    if not isinstance(data, dict):
        raise validation_problem([FieldError(field="body", message="must be a JSON object", code="object_type")])
    request[JSON_BODY] = data   # for the audit record of a PUT/PATCH (redacted there: http/audit.py)
    return data


async def read_body(request: web.Request, model: type[B]) -> B:
    """Parse and validate a request body as ``model``; raises ProblemError (400/413/415/422)."""
    data = await read_json_object(request)
    owned = model.server_owned & data.keys()
    if not owned and (valid := request.get(VALID_BODY)) is not None and valid[0] is model:
        return valid[1]   # validated already (the same dict, the same model): validating again changes nothing
    errors = [FieldError(field=k, message="server-owned field: Tessera sets it, a client cannot", code="server_owned")
              for k in sorted(owned)]
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


# --- path, query and header values -----------------------------------------------------------------------

def _invalid(param: Param, message: str, code: str) -> ProblemError:
    return validation_problem([FieldError(field=param.name, message=message, code=code)])


def parse_value(param: Param, raw: str) -> Any:
    """``raw`` (a path, query or header value) as ``param.type``; a 422 naming the parameter otherwise. An integer
    parameter takes decimal digits only (``10``, not ``10.0``, ``+10`` or ``1_0``)."""
    value: Any = raw
    if param.is_integer:
        if not _INTEGER.fullmatch(raw):
            bounds = param.schema
            raise _invalid(param, f"must be an integer from {bounds.get('minimum')} to {bounds.get('maximum')}",
                           param.location)
        value = int(raw)
    try:
        return param.adapter.validate_python(value)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise _invalid(param, err["msg"], err["type"]) from None


def query_value(request: web.Request, param: Param) -> Any:
    """The query parameter ``param`` (its default when absent); 422 when given more than once or not valid."""
    values = request.query.getall(param.name, [])
    if len(values) > 1:
        raise _invalid(param, "give it at most once", "query_repeated")
    if not values:
        return param.default
    return parse_value(param, values[0])


def header_value(request: web.Request, param: Param) -> Any:
    """The header ``param`` (None when absent); 422 when repeated or not valid."""
    values = request.headers.getall(param.name, [])
    if len(values) > 1:
        raise _invalid(param, "send it at most once", "header_repeated")
    return parse_value(param, values[0]) if values else None


def path_value(request: web.Request, param: Param) -> Any:
    """The path parameter ``param``, valid as its type; a 422 naming it otherwise."""
    return parse_value(param, request.match_info[param.name])


def path_uuid(request: web.Request, name: str, what: str) -> uuid.UUID:
    """A UUID path parameter (the 8-4-4-4-12 form); a malformed one is simply an unknown resource (404)."""
    raw = request.match_info[name]
    if not _UUID.fullmatch(raw):
        raise not_found(what)
    return uuid.UUID(raw)
