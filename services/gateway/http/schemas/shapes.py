"""HTTP models of capacity shapes."""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from .base import Body, Out, Rejection

GpuModel = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class ShapeDefinition(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"name", "version", "deleted"})
    kind: Literal["bare_metal", "vm", "mig"]
    gpu_count: int = Field(ge=1, le=16)
    gpu_model: GpuModel | None = None
    mig_profile: str | None = Field(default=None, min_length=1, max_length=32)


class ShapeOut(Out):
    """A capacity shape a tenant may ask for."""

    name: str
    kind: Literal["bare_metal", "vm", "mig"]
    gpu_count: int
    gpu_model: str | None = None
    mig_profile: str | None = None
    deleted: bool = False
    version: int | None = Field(default=None, description="null: a built-in default (the catalog is still empty).")
    last_rejection: Rejection | None = None


class ShapeList(Out):
    """The shapes a tenant may ask for, by name."""

    items: list[ShapeOut]
