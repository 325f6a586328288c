"""Compare owned kernel objects with the desired ones: which repairs turn one into the other. Pure: no I/O.

``plan`` takes fingerprints of what is there (observed, or what the previous
desired state implied) and the desired state, and returns the repairs in the
order that works: removals first, most dependent first (slots, legs, VXLAN,
bridges, rules, namespaces), then creations in the opposite order
(``model.KIND_ORDER``: rules before the ports they guard). Carrying them out
against the kernel is ``adapters.dataplane.repair``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .model import KIND_ORDER, DesiredNode

Key = tuple[str, str]


@dataclass(frozen=True)
class Repair:
    """One change: action is create (missing), remove (stray) or replace (there, but not as desired)."""

    action: str
    kind: str
    name: str
    detail: str = ""


def plan(current: Mapping[Key, str], desired: DesiredNode) -> list[Repair]:
    """The repairs that turn ``current`` into ``desired`` (empty when they agree)."""
    want = desired.objects()
    removes = [Repair("remove", k, n, f"not desired (found {fp!r})" if fp else "not desired")
               for (k, n), fp in current.items() if (k, n) not in want]
    replaces = [Repair("replace", k, n, f"found {current[(k, n)]!r}, want {o.fp!r}")
                for (k, n), o in want.items() if (k, n) in current and current[(k, n)] != o.fp]
    creates = [Repair("create", k, n, "missing") for (k, n) in want if (k, n) not in current]
    gone_routers = {r.name for r in removes if r.kind == "router"}
    # a router namespace's removal takes its table along: no separate nft call
    removes = [r for r in removes if not (r.kind == "nft_router" and r.name in gone_routers)]
    rank = {kind: i for i, kind in enumerate(KIND_ORDER)}
    removes.sort(key=lambda r: (-rank[r.kind], r.name))
    ups = sorted(replaces + creates, key=lambda r: (rank[r.kind], r.name))
    return removes + ups
