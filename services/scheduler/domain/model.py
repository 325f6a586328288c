"""Nodes, their GPU slots and first-fit placement (pure, no I/O).

Placement works on an in-memory view of the schedulable capacity; the adapter
builds the view, and the handler locks the chosen node and re-checks the view
of that one node before it claims anything (see handlers.py).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Iterable


class DomainError(Exception):
    """A command does not fit the scheduler's inventory."""


class NodeConflict(DomainError):
    """A registration collides with a different node (same id with another spec, or the same name)."""


@dataclass(frozen=True)
class NodeSpec:
    id: uuid.UUID
    name: str
    gpu_model: str
    gpu_count: int
    labels: dict[str, str] = field(default_factory=dict)

    def differences(self, other: "NodeSpec") -> list[str]:
        """The fields in which ``other`` differs from this spec, as 'field: ours != theirs'."""
        out = []
        for name in ("name", "gpu_model", "gpu_count", "labels"):
            ours, theirs = getattr(self, name), getattr(other, name)
            if ours != theirs:
                out.append(f"{name}: {ours!r} != {theirs!r}")
        return out


def check_reregistration(existing: NodeSpec, incoming: NodeSpec) -> None:
    """Registering an existing node again is a no-op only with the same spec; raises NodeConflict otherwise."""
    diff = existing.differences(incoming)
    if diff:
        raise NodeConflict(f"node {existing.id} is already registered with another spec ({'; '.join(diff)})")


@dataclass(frozen=True)
class NodeView:
    """What placement needs to know of one node: its free slot indices."""

    id: uuid.UUID
    name: str
    gpu_model: str
    free: tuple[int, ...]
    cordoned: bool = False


@dataclass(frozen=True)
class Placement:
    node_id: uuid.UUID
    gpu_model: str
    slots: tuple[int, ...]


def first_fit(nodes: Iterable[NodeView], gpu_count: int, *, after: str | None = None) -> Placement | None:
    """The first non-cordoned node by name (strictly after ``after``, if given) with ``gpu_count`` free
    slots, and its lowest free indices; None if no node fits. All slots are on one node."""
    if gpu_count < 1:
        raise ValueError(f"gpu_count must be at least 1, not {gpu_count}")
    for node in sorted(nodes, key=lambda n: n.name):
        if node.cordoned or (after is not None and node.name <= after):
            continue
        free = sorted(node.free)
        if len(free) >= gpu_count:
            return Placement(node.id, node.gpu_model, tuple(free[:gpu_count]))
    return None


def shortfall(nodes: Iterable[NodeView], gpu_count: int, shape: str) -> str:
    """Why nothing fits, naming what was asked: for the 'no capacity' rejection."""
    schedulable = [n for n in nodes if not n.cordoned]
    best = max((len(n.free) for n in schedulable), default=0)
    return (f"no capacity: {gpu_count} free GPU slot(s) on one node for shape {shape}; "
            f"{len(schedulable)} schedulable node(s), at most {best} free on any one")
