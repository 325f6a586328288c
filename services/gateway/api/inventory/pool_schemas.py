"""HTTP models of node pools."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ...http.schema_base import Body, Out, Rejection, Taints, text

Description = text(500, multiline=True)


class PoolDefinition(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"name", "version"})
    policy: Literal["pack", "spread"] = Field(default="pack", description="pack (default) keeps whole nodes free; spread.")
    taints: Taints = Field(default_factory=dict)
    description: Description = ""


class PoolOut(Out):
    """A node pool."""

    name: str
    policy: Literal["pack", "spread"]
    taints: dict[str, str]
    description: str
    version: int | None = Field(default=None, description="null until the scheduler published the pool.")
    last_rejection: Rejection | None = None


class PoolList(Out):
    """Every pool, by name."""

    items: list[PoolOut]
