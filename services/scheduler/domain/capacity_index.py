"""Indexes of placeable nodes that make a placement decision independent of the node count (pure).

Nodes are partitioned by (pool, GPU model, node taints): every node of a partition is eligible
for exactly the same requests, so eligibility is decided once per partition, never per node.
Inside a partition a placeable node (approved, not cordoned, not reserved) sits in:

- ``buckets[(best_group, free)]``: ``free`` = its whole-free slots, ``best_group`` = the most
  free slots in one (NUMA, NVLink) group. A k-GPU slice fits aligned on any node with
  ``best_group >= k``; pack takes the lowest ``free`` that fits, spread the highest. At most
  (size+1)^2 buckets, so a lookup costs O(size^2) dict probes whatever the node count.
- ``whole[size]``: entirely free nodes (bare metal).
- ``mig_partial[profile]`` / ``mig_free[free]``: nodes with a GPU partitioned for ``profile``
  with room left / with a whole-free MIG-capable GPU.
- ``preempt[cls]``: nodes holding an allocation of preemption class ``("p", priority)`` or
  ``("spot",)``: the only nodes preemption has to look at.
- ``racks[rack][(size, free)]``: placeable nodes with a free slot, by rack, then by node size and
  whole-free slots. A rack's room for a gang's members (``rack_room``) is counted from these few
  entries, never from its nodes: a gang that spans racks finds its candidate racks in O(racks).

Every set holds node ids; an update on hold/free moves one node between O(1) sets.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import ClassVar

from .node_slots import NodeSlots


class Partition:
    __slots__ = (
        "buckets",
        "max_size",
        "members",
        "mig_free",
        "mig_partial",
        "model",
        "pool",
        "preempt",
        "racks",
        "seq",
        "taints",
        "whole",
    )

    def __init__(self, pool: str, model: str, taints: frozenset, seq: int) -> None:
        self.pool, self.model, self.taints, self.seq = pool, model, taints, seq
        self.buckets: dict[tuple[int, int], set[uuid.UUID]] = {}
        self.whole: dict[int, set[uuid.UUID]] = {}
        self.mig_partial: dict[str, set[uuid.UUID]] = {}
        self.mig_free: dict[int, set[uuid.UUID]] = {}
        self.preempt: dict[tuple, set[uuid.UUID]] = {}
        self.racks: dict[str, dict[tuple[int, int], set[uuid.UUID]]] = {}
        self.members: set[uuid.UUID] = set()      # approved, uncordoned nodes (reserved ones too)
        self.max_size = 0

    # ---- maintenance
    def add(self, node: NodeSlots, placeable: bool) -> None:
        """Index ``node`` (remove it first if it was indexed)."""
        nid = node.state.id
        self.members.add(nid)
        self.max_size = max(self.max_size, node.size)
        keys = []
        if placeable and node.size:
            ft = len(node.free)
            keys.append(("b", (node.best_group(), ft)))
            if ft == node.size:
                keys.append(("w", node.size))
            keys.extend(("mp", p) for p in node.mig_partial())
            if node.mig_free():
                keys.append(("mf", ft))
            if ft:
                keys.append(("rk", (node.state.rack, (node.size, ft))))
        keys.extend(("pr", c) for c, n in node.prio.items() if n > 0)
        for kind, key in keys:
            if kind == "rk":
                self.racks.setdefault(key[0], {}).setdefault(key[1], set()).add(nid)
            else:
                self._table(kind).setdefault(key, set()).add(nid)
        node.ikeys = tuple(keys)

    def remove(self, node: NodeSlots) -> None:
        nid = node.state.id
        for kind, key in node.ikeys:
            if kind == "rk":
                rack, key = key
                _discard(self.racks.get(rack, {}), key, nid)
                if not self.racks.get(rack, True):
                    del self.racks[rack]
            else:
                _discard(self._table(kind), key, nid)
        node.ikeys = ()
        self.members.discard(nid)

    _TABLES: ClassVar[dict[str, str]] = {"b": "buckets", "w": "whole", "mp": "mig_partial", "mf": "mig_free", "pr": "preempt"}

    def _table(self, kind: str) -> dict:
        return getattr(self, self._TABLES[kind])

    # ---- lookups: each yields (rank, seq, node-id set) in rank order; lower rank is better
    def vm_candidates(self, k: int, pack: bool) -> Iterator[tuple]:
        """Aligned buckets (phase 0) before unaligned ones (phase 1), each by pack/spread order."""
        frees = range(k, self.max_size + 1) if pack else range(self.max_size, k - 1, -1)
        for phase in (0, 1):
            for ft in frees:
                bgs = range(k, ft + 1) if phase == 0 else range(min(k, ft + 1))
                for bg in bgs:
                    s = self.buckets.get((bg, ft))
                    if s:
                        yield (phase, ft if pack else -ft, bg), self.seq, s

    def bare_metal_candidates(self, k: int) -> Iterator[tuple]:
        s = self.whole.get(k)
        if s:
            yield (0, 0, 0), self.seq, s

    def mig_candidates(self, profile: str, pack: bool) -> Iterator[tuple]:
        s = self.mig_partial.get(profile)
        if s:
            yield (0, 0, 0), self.seq, s
        for ft in sorted(self.mig_free, reverse=not pack):
            yield (1, ft if pack else -ft, 0), self.seq, self.mig_free[ft]

    def most_free(self) -> Iterator[set[uuid.UUID]]:
        """Placeable node sets, most free slots first (for reservations)."""
        for key in sorted(self.buckets, key=lambda bk: (-bk[1], -bk[0])):
            yield self.buckets[key]

    def rack_room(self, k: int, bare: bool) -> Iterator[tuple[str, int, int]]:
        """(rack, members of ``k`` GPUs it has room for, the fewest free slots of its nodes with room) for each
        rack with room: a VM member fits wherever ``k`` slots are free (across groups as a fallback), a bare-metal
        one on an entirely free node of exactly ``k`` slots."""
        for rack, counts in self.racks.items():
            room, low = 0, 0
            for (size, free), ids in counts.items():
                r = _room(size, free, k, bare) * len(ids)
                if r:
                    room += r
                    low = free if not low else min(low, free)
            if room:
                yield rack, room, low

    def rack_nodes(self, rack: str, k: int, bare: bool) -> Iterator[tuple[int, int, uuid.UUID]]:
        """The rack's placeable nodes with room for one member of ``k`` GPUs, as (free slots, id as int, id)."""
        for (size, free), ids in self.racks.get(rack, {}).items():
            if _room(size, free, k, bare):
                yield from ((free, n.int, n) for n in ids)

    def rack_nodes_at(self, rack: str, free: int, k: int, bare: bool) -> Iterator[uuid.UUID]:
        """The rack's placeable nodes with exactly ``free`` free slots and room for one member of ``k`` GPUs."""
        for (size, f), ids in self.racks.get(rack, {}).items():
            if f == free and _room(size, f, k, bare):
                yield from ids


def _room(size: int, free: int, k: int, bare: bool) -> int:
    """Members of ``k`` GPUs a node of ``size`` slots with ``free`` whole-free slots has room for: as many as fit
    (a VM member), or one on an entirely free node of exactly ``k`` slots (a bare-metal member)."""
    if bare:
        return 1 if free == size == k else 0
    return free // k


def _discard(table: dict, key, nid: uuid.UUID) -> None:
    s = table.get(key)
    if s is not None:
        s.discard(nid)
        if not s:
            del table[key]

