"""Carry out a reconcile plan against the node's kernel: blocking, each step idempotent.

``plan`` (pure, ``domain.dataplane.reconcile``) says what to change; ``apply``
runs the repairs against a ``Kernel`` in order, so a repeated or interrupted
apply converges.
"""
from __future__ import annotations

from ...domain.dataplane.model import DesiredNode
from ...domain.dataplane.names import bridge_name, leg_name, port_of_slot_netns, vxlan_name
from ...domain.dataplane.reconcile import Repair
from .kernel import Kernel


def remove(kernel: Kernel, kind: str, name: str) -> None:
    """Remove one owned object (idempotent)."""
    if kind == "router":
        kernel.remove_netns(name)
    elif kind in ("bridge", "vxlan", "leg"):
        kernel.remove_link(name)
    elif kind == "slot" and not name.startswith("ts-"):   # a VM's tap, named by its port: its VM holds it
        kernel.unplug_tap(name)
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
    elif kind == "slot" and desired.guest_ports:
        kernel.plug_tap(next(s for s in desired.slots.values() if s.port == name))
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
