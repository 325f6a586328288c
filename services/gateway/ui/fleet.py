"""The fleet map's cells: one per GPU slot of a node, coloured by what the read models say of it.

Derived per node, in this order: the slots of each allocation on the node (its tenant's colour; ``wiping`` while
it is RELEASING: the node wipes its slots on release), then the slots the scheduler's node document lists as
quarantined (a failed wipe; ``quarantined``), then the rest, which are ``free`` unless the node is cordoned
(``cordoned``), unhealthy or draining (``unhealthy``), or not yet schedulable (``offline``). The read models hold
no slot index per allocation, so the cells show how many slots are in each state, not which ones.
"""
from __future__ import annotations

import uuid
import zlib
from collections import defaultdict
from dataclasses import dataclass

PALETTE = 12   # tenant colours t0..t11 in app.css
UNHEALTHY = ("suspect", "unreachable")


@dataclass(frozen=True)
class Cell:
    kind: str    # free, wiping, quarantined, cordoned, unhealthy, offline, or t0..t11 (a tenant's allocation)
    title: str   # the tooltip


def tenant_colour(tenant_id: uuid.UUID) -> str:
    """A tenant's colour class, the same on every page and in every process."""
    return f"t{zlib.crc32(tenant_id.bytes) % PALETTE}"


def idle_kind(node) -> str:
    if node["cordoned"]:
        return "cordoned"
    if node["health"] in UNHEALTHY or node["draining"]:
        return "unhealthy"
    return "free" if node["status"] == "schedulable" else "offline"


def cells(node, allocations: list, quarantined: int, names: dict[uuid.UUID, str]) -> list[Cell]:
    """The node's ``gpu_count`` cells."""
    out: list[Cell] = []
    for a in allocations:
        who = names.get(a["tenant_id"], str(a["tenant_id"])[:8])
        if a["state"] == "RELEASING":
            out += [Cell("wiping", f"wiping after {who}'s allocation {str(a['id'])[:8]}")] * a["gpu_count"]
        else:
            out += [Cell(tenant_colour(a["tenant_id"]), f"{who}: allocation {str(a['id'])[:8]} ({a['state']})")] * a["gpu_count"]
    out += [Cell("quarantined", "quarantined: its last wipe failed")] * quarantined
    idle = idle_kind(node)
    out += [Cell(idle, idle)] * max(node["gpu_count"] - len(out), 0)
    return out[:node["gpu_count"]]


def fleet_rows(nodes: list, allocations: list, quarantine: dict, names: dict[uuid.UUID, str]) -> list[dict]:
    """Each node of the page with its cells."""
    by_node: dict[uuid.UUID, list] = defaultdict(list)
    for a in allocations:
        by_node[a["node_id"]].append(a)
    return [{"node": n, "cells": cells(n, by_node[n["id"]], quarantine.get(n["id"], 0), names)} for n in nodes]


def legend(allocations: list, names: dict[uuid.UUID, str]) -> list[tuple[str, str]]:
    """(colour class, tenant name) of the tenants holding slots on the page."""
    seen = {a["tenant_id"] for a in allocations if a["state"] != "RELEASING"}
    return sorted((tenant_colour(t), names.get(t, str(t)[:8])) for t in seen)
