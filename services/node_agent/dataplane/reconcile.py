"""Compare owned kernel objects with the desired ones and carry out the difference.

``plan`` is pure: from fingerprints of what is there (observed, or what the
previous desired state implied) and the desired state, the repairs in the order
that works: removals first, most dependent first (slots, legs, VXLAN, bridges,
rules, namespaces), then creations in the opposite order (``model.KIND_ORDER``:
rules before the ports they guard). ``apply`` runs them
against a ``Kernel`` (blocking); each step is idempotent, so a repeated or
interrupted apply converges.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .kernel import Kernel
from .model import KIND_ORDER, DesiredNode
from .names import bridge_name, leg_name, port_of_slot_netns, vxlan_name

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


def remove(kernel: Kernel, kind: str, name: str) -> None:
    """Remove one owned object (idempotent)."""
    if kind == "router":
        kernel.remove_netns(name)
    elif kind in ("bridge", "vxlan", "leg"):
        kernel.remove_link(name)
    elif kind == "slot":
        kernel.remove_slot(name, port_of_slot_netns(name))
    elif kind == "nft_node":
        kernel.apply_nft(None, "bridge", None)
    elif kind == "nft_router":
        kernel.apply_nft(name, "inet", None)


def create(kernel: Kernel, desired: DesiredNode, kind: str, name: str) -> None:
    """Create (or re-create) one desired object (idempotent); raises KernelError, leaving nothing half-made."""
    if kind == "router":
        kernel.ensure_router(name)
    elif kind in ("bridge", "vxlan", "leg"):
        namer = {"bridge": bridge_name, "vxlan": vxlan_name, "leg": leg_name}[kind]
        seg = next(s for s in desired.segments.values() if namer(s.vni) == name)
        {"bridge": kernel.ensure_bridge, "vxlan": kernel.ensure_vxlan, "leg": kernel.ensure_leg}[kind](seg)
    elif kind == "slot":
        kernel.ensure_slot(next(s for s in desired.slots.values() if s.netns == name))
    elif kind == "nft_node":
        kernel.apply_nft(None, "bridge", desired.node_nft, desired.objects()[(kind, name)].fp)
    elif kind == "nft_router":
        kernel.apply_nft(name, "inet", desired.router_nft[name], desired.objects()[(kind, name)].fp)


def apply(kernel: Kernel, desired: DesiredNode, repairs: list[Repair]) -> None:
    """Carry out ``repairs`` in order; a replace removes, then creates. Raises KernelError at the first failure."""
    for r in repairs:
        nft_swap = r.action == "replace" and r.kind.startswith("nft_")   # one atomic nft transaction
        if r.action == "remove" or (r.action == "replace" and not nft_swap):
            remove(kernel, r.kind, r.name)
        if r.action in ("create", "replace"):
            create(kernel, desired, r.kind, r.name)
