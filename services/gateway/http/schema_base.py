"""What the HTTP API's models share: strict request bodies, responses, problem documents, and the
constrained strings and integers every resource uses.

Each request model names its ``server_owned`` fields: a client sending one gets a 422
that says the field is set by Tessera, rather than a generic "unknown field".

Every string a client sends goes through ``Text`` (directly, or through the named types below): it has a
maximum length, and it refuses the characters nothing downstream can store or sensibly show — NUL (PostgreSQL's
text and jsonb cannot hold it), the other C0 controls and DEL, the C1 controls (tab, line feed and carriage
return only in multi-line text), and lone surrogates (a JSON ``"\\ud800"`` has no UTF-8 encoding). The OpenAPI
document states the same rule as each string's ``pattern``, generated from the same constants.
"""
from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from services.scheduler.contracts import NAME

from ..domain.scheduling import TAINT_VALUE

# --- strings ---------------------------------------------------------------------------------------

# The characters a string may not hold, as a regex character class body: C0 controls, DEL, C1 controls.
_CONTROLS = r"\u0000-\u001f\u007f-\u009f"
# ... multi-line text keeps tab (U+0009), line feed (U+000A) and carriage return (U+000D).
_CONTROLS_BUT_LINES = r"\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f"
SINGLE_LINE = rf"^[^{_CONTROLS}]*$"
MULTI_LINE = rf"^[^{_CONTROLS_BUT_LINES}]*$"
_REFUSED = {False: re.compile(f"[{_CONTROLS}]"), True: re.compile(f"[{_CONTROLS_BUT_LINES}]")}
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Text:
    """A string annotation (``Annotated[str, StringConstraints(...), Text()]``): refuses control characters and
    lone surrogates (422 naming the field, code ``control_character`` / ``lone_surrogate``); in the JSON schema,
    the same rule as ``pattern`` unless the string has a stricter pattern of its own."""

    multiline: bool = False

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        out = handler(schema)
        out.setdefault("pattern", MULTI_LINE if self.multiline else SINGLE_LINE)
        return out

    def check(self, value: str) -> str:
        bad = _REFUSED[self.multiline].search(value)
        if bad:
            raise PydanticCustomError("control_character", "must not contain control characters (found U+{code})",
                                      {"code": f"{ord(bad.group()):04X}"})
        bad = _SURROGATE.search(value)
        if bad:
            raise PydanticCustomError("lone_surrogate", "must be valid Unicode (found the lone surrogate U+{code})",
                                      {"code": f"{ord(bad.group()):04X}"})
        return value


@dataclass(frozen=True)
class Explained:
    """A string annotation for a rule the document states as a long ``pattern`` (``^(?:...)$``, matched whole) that
    the server explains in words: ``explain(value)`` says why a value is refused (None: it is not), and a value it
    lets through must match the pattern too (422 code ``code``)."""

    pattern: str
    explain: Callable[[str], str | None]
    code: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        return {**handler(schema), "pattern": self.pattern}

    def check(self, value: str) -> str:
        problem = self.explain(value) or (None if re.fullmatch(self.pattern, value) else f"{value!r} is not valid here")
        if problem:
            raise PydanticCustomError(self.code, "{problem}", {"problem": problem})
        return value


def text(max_length: int, *, min_length: int = 0, pattern: str | None = None, multiline: bool = False) -> Any:
    """A string type: at most ``max_length`` characters, no control characters (``Text``), optionally a pattern
    (ECMA-262 and Python ``re`` alike: ASCII classes only, no ``\\d`` or ``\\w``)."""
    return Annotated[str, StringConstraints(min_length=min_length or None, max_length=max_length, pattern=pattern),
                     Text(multiline)]


ShapeName = text(63, min_length=1, pattern=NAME)        # pools and shapes: the scheduler's names
ResourceName = text(63, min_length=1, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
GpuModel = text(64, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
LabelKey = text(128, min_length=1, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$")
LabelValue = text(256)
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=32, description="At most 32 string labels.")]
TaintValue = text(80, pattern=TAINT_VALUE)
Taints = Annotated[dict[LabelKey, TaintValue], Field(max_length=16, description="key -> 'value:NoSchedule'.")]


# --- ids -------------------------------------------------------------------------------------------

UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


def _uuid_text(value: Any) -> Any:
    """A UUID is written 8-4-4-4-12 (JSON Schema's ``format: uuid``), not in the other forms Python reads."""
    if isinstance(value, str) and not re.fullmatch(UUID_PATTERN, value):
        raise PydanticCustomError("uuid_parsing", "must be a UUID: 8-4-4-4-12 hexadecimal digits")
    return value


Uuid = Annotated[uuid.UUID, Field(strict=False), BeforeValidator(_uuid_text)]
"""A UUID in a request body: the 8-4-4-4-12 string."""


# --- integers --------------------------------------------------------------------------------------

def _whole_number(value: Any) -> Any:
    """JSON has numbers, not integers: ``10.0`` is the integer 10 (as JSON Schema's ``integer`` says); ``10.5``,
    ``"10"`` and ``true`` stay what they are and are refused by the strict ``int`` after this."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_whole_number)]
"""Every integer of a request body: a JSON number without fraction (``10`` or ``10.0``), never a string or bool."""


def integer(ge: int, le: int) -> Any:
    """An ``Int`` from ``ge`` to ``le`` that can sit in a union (``integer(1, 9) | None``): the bounds go on the
    integer itself, so the JSON schema states them as minimum and maximum."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_whole_number)]


def constraints(*rules: str) -> dict:
    """``json_schema_extra`` for a body whose fields are compared with each other, which JSON Schema cannot say:
    ``x-constraints: ["guaranteed <= limit"]`` means that whenever both are numbers, the first is at most the
    second (the body is refused otherwise, with a 422 naming one of them)."""
    return {"x-constraints": list(rules)}


# --- optional fields that are not nullable -----------------------------------------------------------

def _no_default(schema: dict) -> None:
    schema.pop("default", None)


def omittable(**kwargs: Any) -> Any:
    """A field a client may leave out but not send as null (``x: T = omittable()``): the model refuses null,
    and the JSON schema shows neither null nor a null default."""
    return Field(default=None, json_schema_extra=_no_default, **kwargs)


# --- models ----------------------------------------------------------------------------------------

class Body(BaseModel):
    """A request body: strict types, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", strict=True)
    server_owned: ClassVar[frozenset[str]] = frozenset()


class Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FieldError(Out):
    """One invalid field, query or header parameter."""

    field: str = Field(description="Dotted path of the offending field (or query/header parameter).")
    message: str
    code: str


class Problem(Out):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldError] | None = None


class Rejection(Out):
    """Why the scheduler refused the last inventory command about this resource."""

    command: str
    reason: str
    event_id: str | None = None
    at: datetime | None = None


# --- the JSON schema of these types ------------------------------------------------------------------

class ApiJsonSchema(GenerateJsonSchema):
    """pydantic's JSON schema, with a dict's key rule stated whole: for ``dict[LabelKey, V]`` pydantic writes
    ``patternProperties`` (and ``propertyNames`` without the pattern), which lets a key that misses the pattern
    hold any value at all; the server refuses such a key, so the document says ``propertyNames`` (the key's
    whole schema) and ``additionalProperties`` (the value's)."""

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        out = super().dict_schema(schema)
        patterns = out.pop("patternProperties", None)
        if patterns:
            [(pattern, values)] = patterns.items()
            out["propertyNames"] = {**out.get("propertyNames", {}), "pattern": pattern}
            out["additionalProperties"] = values
        return out


RFC3339_PATTERN = r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}:\d{2})$"
_RFC3339 = re.compile(RFC3339_PATTERN)


def _rfc3339(raw: object) -> object:
    if not isinstance(raw, str) or not _RFC3339.match(raw):
        raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2026-01-01T00:00:00Z")
    return raw


Instant = Annotated[AwareDatetime, BeforeValidator(_rfc3339),
                    Field(json_schema_extra={"maxLength": 35, "pattern": RFC3339_PATTERN})]
"""A query parameter's date-time: RFC 3339 with an offset only (not a Unix number, not a naive time)."""
