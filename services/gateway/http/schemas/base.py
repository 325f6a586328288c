"""What the HTTP API's models share: strict request bodies, responses, problem documents, and the
constrained strings several resources use.

Each request model names its ``server_owned`` fields: a client sending one gets a 422
that says the field is set by Tessera, rather than a generic "unknown field".
"""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ...domain.scheduling import TAINT_VALUE

ShapeName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9.\-]{0,61}[a-z0-9])?$")]
ResourceName = Annotated[str, StringConstraints(min_length=1, max_length=63,
                                                pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$")]
LabelValue = Annotated[str, StringConstraints(max_length=256)]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=32, description="At most 32 string labels.")]
TaintValue = Annotated[str, StringConstraints(max_length=80, pattern=TAINT_VALUE)]
Taints = Annotated[dict[LabelKey, TaintValue], Field(max_length=16, description="key -> 'value:NoSchedule'.")]


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
