"""The records placement works with: nodes, pools, requests and placements (pure, no I/O).

Taints are ``{key: value}`` with effect NoSchedule (a ``:NoSchedule`` suffix on the value is
accepted); a toleration ``"key=value"`` tolerates that taint, ``"key"`` any value of the key.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from .shapes import Shape
from .topology import SlotMap


class UnknownNode(KeyError):
    """The node id is not in the inventory."""


@dataclass
class NodeState:
    id: uuid.UUID
    name: str
    pool: str
    gpu_model: str
    region: str
    site: str
    rack: str
    labels: dict[str, str]
    taints: dict[str, str]
    cordoned: bool
    slot_map: SlotMap
    approved: bool


@dataclass(frozen=True)
class Pool:
    name: str
    policy: Literal["pack", "spread"] = "pack"
    taints: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.policy not in ("pack", "spread"):
            raise ValueError(f"pool {self.name}: policy must be 'pack' or 'spread', not {self.policy!r}")


@dataclass(frozen=True)
class Request:
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    shape: Shape
    priority: int = 0
    spot: bool = False
    pool: str | None = None
    tolerations: frozenset[str] = frozenset()
    enqueued_at: float = 0.0
    fail_fast: bool = False       # reject instead of waiting when nothing fits now

    def __post_init__(self) -> None:
        if not isinstance(self.tolerations, frozenset):   # hashable: placement caches by it
            object.__setattr__(self, "tolerations", frozenset(self.tolerations))


@dataclass(frozen=True)
class Placement:
    node_id: uuid.UUID
    pool: str
    gpu_model: str
    slots: tuple[int, ...]
    mig_profile: str | None = None
    # False: a 1/2/4-GPU slice spanning NUMA/NVLink groups (the fallback). Informational: not
    # part of equality, so a placement read back from storage without it equals the original.
    aligned: bool = field(default=True, compare=False)


def tolerates(tolerations: Iterable[str], taints: dict[str, str]) -> bool:
    """Whether ``tolerations`` cover every NoSchedule taint in ``taints``."""
    tol = {t.removesuffix(":NoSchedule") for t in tolerations}   # "k=v:NoSchedule" is the same toleration as "k=v"
    for key, value in taints.items():
        value = value.removesuffix(":NoSchedule")
        if key not in tol and f"{key}={value}" not in tol:
            return False
    return True
