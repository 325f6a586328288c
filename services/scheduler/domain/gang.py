"""Gangs: N allocations placed all or nothing (pure, no I/O).

A gang is N members of one shape (a cluster's nodes). ``plan`` finds where all N would go now, or
None; it never leaves anything held (it holds members through the Inventory while it looks, so each
member sees the slots the previous ones took, and frees them all before returning).

Where: every member in ONE (pool, GPU model), so one quota is charged and the cluster is uniform.
Preference, best first: the fewest racks, then the fewest NVLink domains (a domain is one node's
NVLink group: a gang of 1/2/4-GPU slices may share one). The ordinary placement (the pool's pack or
spread, member after member) is tried first; pack puts small members on one node, so that is often
one rack already. Only when it spans racks are the racks scanned: each rack's own capacity for the
gang is counted from the index's per-rack counts (capacity_index.py) and the fullest racks are taken
first, which needs the fewest of them. The count costs O(racks of the gang's partitions), whatever the
node count; only the racks used are then visited node by node.

Waiting (scheduler.py): a gang that does not fit waits as ONE queue entry holding nothing, in fair
order like any request; every later pass tries it whole. Smaller requests behind it are placed when
they fit (backfill); an aged gang reserves one node like a regular request so backfill cannot take
everything forever.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Literal

from .capacity_index import Partition
from .inventory import Inventory, Placement, Request
from .quota import QuotaVerdict

Pair = tuple[str, str]      # (pool, GPU model): one quota per tenant


@dataclass(frozen=True)
class Gang:
    """``template`` is the request each member makes (its ``allocation_id`` is the gang's id, the
    gang's single entry in the queue); ``members`` are the allocation ids, in the caller's order."""
    template: Request
    members: tuple[uuid.UUID, ...]

    @property
    def gang_id(self) -> uuid.UUID:
        return self.template.allocation_id

    @property
    def tenant_id(self) -> uuid.UUID:
        return self.template.tenant_id

    @property
    def units(self) -> int:
        """GPUs the whole gang charges against its quota."""
        return self.template.shape.quota_units * len(self.members)

    def requests(self) -> list[Request]:
        return [replace(self.template, allocation_id=m) for m in self.members]


@dataclass(frozen=True)
class GangPlacement:
    gang: Gang
    placements: tuple[Placement, ...]     # member i's placement is placements[i]
    racks: int
    nvlink_domains: int

    def members(self) -> list[tuple[Request, Placement]]:
        return list(zip(self.gang.requests(), self.placements, strict=True))


@dataclass(frozen=True)
class GangDecision:
    kind: Literal["placed", "queued", "rejected"]
    placement: GangPlacement | None = None
    reason: str = ""
    code: str = ""                         # rejected: quota-exceeded, no-capacity, queue-full, invalid-request
    quota_verdict: QuotaVerdict | None = None


def plan(inv: Inventory, gang: Gang, admit: Callable[[Pair], bool], *, keep: bool = False
         ) -> GangPlacement | None:
    """Where the whole gang goes now (see module docstring), or None. Leaves the inventory as it was,
    except that with ``keep`` the placement returned stays held by its members (the caller grants it:
    holding the same placement again is a no-op), which spares freeing and taking it again."""
    reqs = gang.requests()
    together = _one_node(inv, gang, reqs, admit, keep)
    if together is not None:
        return score(inv, gang, together)
    best = _greedy(inv, reqs, admit, keep)
    if best is None:
        return None
    scored = score(inv, gang, best)
    if scored.racks == 1 or gang.template.shape.kind == "mig":
        return scored
    _drop(inv, reqs, keep)
    by_rack = _by_rack(inv, reqs, (best[0].pool, best[0].gpu_model), keep)
    if by_rack is not None:
        other = score(inv, gang, by_rack)
        if (other.racks, other.nvlink_domains) < (scored.racks, scored.nvlink_domains):
            return other
        _drop(inv, reqs, keep)
    if keep:
        for r, p in zip(reqs, best, strict=True):
            inv.hold(r.allocation_id, r, p)
    return scored


def _drop(inv: Inventory, reqs: list[Request], kept: bool) -> None:
    """Free what a kept trial holds (nothing to do when the trial freed it itself)."""
    if kept:
        for r in reqs:
            inv.free(r.allocation_id)


def score(inv: Inventory, gang: Gang, placements: Iterable[Placement]) -> GangPlacement:
    """The placement with its distinct racks and NVLink domains counted."""
    placements = tuple(placements)
    racks, domains = set(), set()
    for p in placements:
        node = inv.node(p.node_id)
        racks.add(node.state.rack if node is not None else p.node_id)
        for s in p.slots:
            group = node.group_of.get(s) if node is not None else None
            domains.add((p.node_id, group[1] if group else 0))
    return GangPlacement(gang, placements, len(racks), len(domains))


def _one_node(inv: Inventory, gang: Gang, reqs: list[Request], admit: Callable[[Pair], bool], keep: bool
              ) -> list[Placement] | None:
    """Small VM members all on one node, found by the index as one slice of their total (rounded up to a
    slice size: 3 x 1 GPU asks for 4 free, aligned in one NVLink group where a node has them); None when
    the total exceeds a node or no node has it."""
    shape = gang.template.shape
    total = shape.gpu_count * len(reqs)
    size = next((n for n in (1, 2, 4, 8) if n >= total), None)
    if shape.kind != "vm" or size is None:
        return None
    p = inv.place(replace(gang.template, shape=replace(shape, name=f"{shape.name}x{len(reqs)}", gpu_count=size)),
                  admit=admit)
    if p is None:
        return None
    return _fill(inv, reqs, [p.node_id], keep)


def _greedy(inv: Inventory, reqs: list[Request], admit: Callable[[Pair], bool], keep: bool
            ) -> list[Placement] | None:
    """Member after member by the ordinary placement; the first member picks the (pool, model). Held
    afterwards only when ``keep`` and every member found a place."""
    held: list[Request] = []
    out: list[Placement] = []
    try:
        for r in reqs:
            p = inv.place(r, admit=admit if not out else (out[0].pool, out[0].gpu_model).__eq__)
            if p is None:
                return None
            inv.hold(r.allocation_id, r, p)
            held.append(r)
            out.append(p)
        if keep:
            held = []
        return out
    finally:
        for r in held:
            inv.free(r.allocation_id)


def _by_rack(inv: Inventory, reqs: list[Request], pair: Pair, keep: bool) -> list[Placement] | None:
    """The fewest racks of ``pair``'s nodes that hold every member: one rack if any has room (the one with
    the least room that fits, as pack would), else the roomiest racks first. None when even every rack
    together does not (the greedy placement did, so rarely)."""
    k, bare = reqs[0].shape.gpu_count, reqs[0].shape.kind == "bare_metal"
    parts = [p for p in inv.eligible(reqs[0]) if (p.pool, p.model) == pair]
    racks = _candidate_racks(parts, k, bare)
    for _, rack in _in_turn(racks, parts, k, bare, least=len(reqs)):
        got = _fill(inv, reqs, _rack_nodes(parts, rack, k, bare), keep)
        if got is not None:
            return got
    chosen: list[uuid.UUID] = []
    total = 0
    for room, rack in _in_turn(racks, parts, k, bare, roomiest=True):
        chosen += _rack_nodes(parts, rack, k, bare)
        total += room
        if total >= len(reqs):
            break
    return _fill(inv, reqs, chosen, keep)


def _candidate_racks(parts: list[Partition], k: int, bare: bool) -> list[tuple[int, int, str]]:
    """Every rack with room for one member as (members it has room for, the fewest free slots of its nodes
    with room, rack), least room first. Counted from the index's per-rack counts (``Partition.rack_room``),
    never from the nodes."""
    room: dict[str, list[int]] = {}
    for part in parts:
        for rack, r, low in part.rack_room(k, bare):
            have = room.get(rack)
            if have is None:
                room[rack] = [r, low]
            else:
                have[0] += r
                have[1] = min(have[1], low)
    return sorted((r, low, rack) for rack, (r, low) in room.items())


def _in_turn(racks: list[tuple[int, int, str]], parts: list[Partition], k: int, bare: bool, *, least: int = 0,
             roomiest: bool = False) -> Iterator[tuple[int, str]]:
    """(room, rack) in the order racks are tried: least room first (``roomiest``: most first), then the rack
    whose first node (fewest free slots, then lowest id) comes first; racks with room under ``least`` skipped.
    The nodes' ids are read only to order racks of equal room and fewest free slots, when they are reached."""
    for (room, low), same in groupby(reversed(racks) if roomiest else racks, key=lambda t: t[:2]):
        if room < least:
            continue
        names = [rack for _, _, rack in same]
        if len(names) > 1:
            names.sort(key=lambda rack: min(n.int for part in parts for n in part.rack_nodes_at(rack, low, k, bare)),
                       reverse=roomiest)
        for rack in names:
            yield room, rack


def _rack_nodes(parts: list[Partition], rack: str, k: int, bare: bool) -> list[uuid.UUID]:
    """A rack's nodes with room for one member, as ``_fill`` takes them: fewest free slots first, then by id."""
    return [n for _, _, n in sorted(t for part in parts for t in part.rack_nodes(rack, k, bare))]


def _fill(inv: Inventory, reqs: list[Request], nodes: list[uuid.UUID], keep: bool) -> list[Placement] | None:
    """Every member on ``nodes``, in their order, each node filled before the next; None (nothing held)
    when they do not all fit. Held afterwards only when ``keep``."""
    held: list[Request] = []
    out: list[Placement] = []
    try:
        for nid in dict.fromkeys(nodes):
            while len(out) < len(reqs):
                r = reqs[len(out)]
                p = inv.place_on(nid, r)
                if p is None:
                    break
                inv.hold(r.allocation_id, r, p)
                held.append(r)
                out.append(p)
        if len(out) < len(reqs):
            return None
        if keep:
            held = []
        return out
    finally:
        for r in held:
            inv.free(r.allocation_id)
