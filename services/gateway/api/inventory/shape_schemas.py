"""HTTP models of capacity shapes."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from ...domain.scheduling import VM_GPU_COUNTS
from ...http.schema_base import Body, GpuModel, Int, Out, Problem, Rejection, text

MigProfile = text(32, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$")
# The rules of shape_definition_errors (a 422 from PUT /v1/shapes/{name}), as JSON Schema states them.
_SHAPE_RULES = {"allOf": [
    {"if": {"properties": {"kind": {"const": "mig"}}, "required": ["kind"]},
     "then": {"properties": {"gpu_count": {"const": 1}, "mig_profile": {"type": "string"}}, "required": ["mig_profile"]},
     "else": {"properties": {"mig_profile": {"type": "null"}}}},
    {"if": {"properties": {"kind": {"const": "vm"}}, "required": ["kind"]},
     "then": {"properties": {"gpu_count": {"enum": list(VM_GPU_COUNTS)}}}},
]}


class ShapeDefinition(Body):
    """A mig shape is one instance on one GPU (gpu_count 1) and names its mig_profile; only a mig shape has one; a vm
    slice has 1, 2, 4 or 8 GPUs."""

    server_owned: ClassVar[frozenset[str]] = frozenset({"name", "version", "deleted"})
    model_config = ConfigDict(json_schema_extra=_SHAPE_RULES)
    kind: Literal["bare_metal", "vm", "mig"]
    gpu_count: Int = Field(ge=1, le=16)
    gpu_model: GpuModel | None = None
    mig_profile: MigProfile | None = None


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


class ShapeConflictProblem(Problem):
    """409: the shape cannot be deleted: allocations use it, or it is the platform's last shape."""

    allocations: int = Field(description="How many live allocations (not RELEASED or FAILED) use the shape; 0 when "
                                         "the refusal is that it is the platform's last shape.")
