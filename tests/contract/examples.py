"""Real example envelopes for every contract message, built from the pydantic models themselves.

``example(model)`` fills each field with a value of its annotated type that satisfies its
constraints, then validates it through the model, so an example is always a model the code
could really send. ``example_envelope`` wraps it exactly as the outbox does (``Outbox.envelope``).
"""
from __future__ import annotations

import types
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel

from shared.contract import Catalog
from shared.envelope import Envelope
from shared.outbox import Outbox


def _bound(metadata: list[Any], kind: type, attr: str, default: int) -> int:
    for m in metadata:
        if isinstance(m, kind):
            return getattr(m, attr)
    return default


def _value(annotation: Any, metadata: list[Any]) -> Any:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:        # e.g. a constrained name: its constraints travel with it
        return _value(args[0], [*metadata, *args[1:]])
    if origin is Literal:
        return args[0]
    if origin in (Union, types.UnionType):
        return _value(next(a for a in args if a is not type(None)), metadata)
    if origin is list:
        return [_value(args[0], [])]
    if origin is dict:
        return {"sim.tessera.io/example": _value(args[1], [])}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return example(annotation).model_dump(mode="json")
    if annotation is str:
        return "x" * max(1, _bound(metadata, annotated_types.MinLen, "min_length", 1))
    if annotation is bool:
        return True
    if annotation is int:
        return _bound(metadata, annotated_types.Ge, "ge", 1)
    if annotation is float:
        return 1.5
    if annotation is uuid.UUID:
        return uuid.uuid4()
    if annotation is datetime:
        return datetime.now(UTC)
    if annotation is Any:          # free-form documents (e.g. a topology): any JSON value is valid
        return "example"
    raise TypeError(f"no example value for {annotation!r}: teach tests/contract/examples.py this type")


def example(model: type[BaseModel]) -> BaseModel:
    """A valid instance of ``model`` with every field (optional ones too) set."""
    values = {name: f.examples[0] if f.examples else _value(f.annotation, f.metadata)
              for name, f in model.model_fields.items()}
    return model.model_validate(values)


def example_envelope(catalog: Catalog, type_: str) -> Envelope:
    """The envelope the owner's outbox would write for an example ``type_`` message, with trace headers."""
    owner = catalog.owner(type_).service
    env = Outbox(owner, catalog).envelope(
        type_, example(catalog.message(type_).model), correlation_id=str(uuid.uuid4()),
        tenant_id=uuid.uuid4(), causation=None)
    return env.model_copy(update={
        "causation_id": uuid.uuid4(),
        "traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
        "tracestate": "tessera=1",
    })
