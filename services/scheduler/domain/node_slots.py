"""One node's schedulable slots, what holds them, and slot choice on that node (pure, no I/O).

A slot is whole-free (in ``free``), held whole by one allocation, or partitioned for MIG
(``mig[slot] = [profile, instances]``; homogeneous, see shapes.py). Slots are grouped by
(NUMA node, NVLink domain): a 2-/4-GPU slice is *aligned* when all its slots share a group.
"""
from __future__ import annotations

import uuid
from collections import Counter

from .shapes import Shape, mig_fits_gpu


class SlotTaken(Exception):
    """A slot asked for is not free (or an allocation id already holds other slots)."""


class NodeSlots:
    """Mutable per-node state kept by the Inventory; not thread-safe (the Inventory is single-writer)."""

    __slots__ = (
        "allocs",
        "free",
        "gfree",
        "group_of",
        "groups",
        "ikeys",
        "mig",
        "part",
        "prio",
        "reserved_for",
        "size",
        "slots",
        "state",
    )

    def __init__(self, state) -> None:
        self.state = state
        sched = state.slot_map.schedulable_slots
        self.slots = {s.index: s for s in sched}
        self.group_of = {s.index: (s.numa, s.nvlink_domain) for s in sched}
        groups: dict[tuple[int, int], list[int]] = {}
        for s in sorted(sched, key=lambda s: s.index):
            groups.setdefault((s.numa, s.nvlink_domain), []).append(s.index)
        self.groups = {g: tuple(m) for g, m in groups.items()}
        self.free = set(self.slots)
        self.gfree = Counter({g: len(m) for g, m in self.groups.items()})
        self.mig: dict[int, list] = {}
        self.allocs: dict[uuid.UUID, tuple] = {}     # allocation id -> (Request, Placement)
        self.size = len(self.slots)
        self.reserved_for: uuid.UUID | None = None
        self.ikeys: tuple = ()                       # index entries, for removal (owned by the index)
        self.prio: Counter = Counter()               # preemption classes present on the node
        self.part = None

    # ---- derived figures the index keys on
    def best_group(self) -> int:
        return max(self.gfree.values(), default=0)

    def mig_free(self) -> bool:
        return any(self.slots[i].mig_capable for i in self.free)

    def mig_partial(self) -> tuple[str, ...]:
        from .shapes import MIG_PROFILES
        return tuple(sorted({p for p, n in self.mig.values() if n < MIG_PROFILES[p].per_gpu}))

    # ---- choosing slots
    def pick(self, shape: Shape, free: set[int] | None = None, mig: dict | None = None):
        """``(slots, aligned)`` for ``shape`` on this node given the free slots (default: the node's
        own), or None if it does not fit. Does not mutate."""
        free = self.free if free is None else free
        mig = self.mig if mig is None else mig
        if shape.kind == "mig":
            return self._pick_mig(shape, free, mig)
        k = shape.gpu_count
        if shape.kind == "bare_metal":
            ok = k == self.size and len(free) == self.size
            return (tuple(sorted(free)), True) if ok else None
        if len(free) < k:
            return None
        best, best_n = None, 0
        for members in self.groups.values():
            n = sum(1 for s in members if s in free)
            if n >= k and (best is None or n < best_n):   # best fit: keep larger aligned blocks whole
                best, best_n = members, n
        if best is not None:
            return tuple([s for s in best if s in free][:k]), True
        chosen: list[int] = []
        by_free = sorted(self.groups.values(), key=lambda m: -sum(1 for s in m if s in free))
        for members in by_free:    # cross groups, filling the fullest first: fewest groups spanned
            chosen.extend(s for s in members if s in free)
        return tuple(sorted(chosen[:k])), k >= 8 and k == self.size   # a whole 8-GPU node is as aligned as it gets

    def _pick_mig(self, shape: Shape, free: set[int], mig: dict):
        cap = shape.mig_per_gpu
        partial = [(n, i) for i, (p, n) in mig.items() if p == shape.mig_profile and n < cap]
        if partial:
            return (max(partial)[1],), True     # the fullest partitioned GPU first (pack)
        fits = [i for i in free if self.slots[i].mig_capable and self._mem_ok(shape, i)]
        if not fits:
            return None
        # a fresh GPU from the group with the fewest free slots, keeping aligned blocks whole
        return (min(fits, key=lambda i: (sum(1 for s in self.groups[self.group_of[i]] if s in free), i)),), True

    def _mem_ok(self, shape: Shape, i: int) -> bool:
        mem = self.slots[i].gpu_memory_gb
        return mem == 0 or mig_fits_gpu(shape.mig_profile, mem)

    # ---- holding and freeing (atomic: everything is checked before anything changes)
    def take(self, shape: Shape, slots: tuple[int, ...], profile: str | None) -> None:
        """Mark ``slots`` held; raises SlotTaken (and changes nothing) if any is unavailable."""
        unknown = [s for s in slots if s not in self.slots]
        if unknown or not slots:
            raise SlotTaken(f"node {self.state.name}: no schedulable slot(s) {unknown or '(none given)'}")
        if profile is not None:
            (s,) = slots
            cur = self.mig.get(s)
            room = cur is not None and cur[0] == profile and cur[1] < shape.mig_per_gpu
            if not room and not (s in self.free and self.slots[s].mig_capable):
                raise SlotTaken(f"node {self.state.name}: slot {s} has no room for a {profile} MIG instance")
            if cur is None:
                self._use(s)
                self.mig[s] = [profile, 1]
            else:
                cur[1] += 1
            return
        taken = [s for s in slots if s not in self.free]
        if taken:
            raise SlotTaken(f"node {self.state.name}: slot(s) {taken} not free")
        for s in slots:
            self._use(s)

    def give(self, slots: tuple[int, ...], profile: str | None) -> None:
        """Return slots taken by ``take``; tolerant of slots that no longer exist (idempotent use)."""
        for s in slots:
            if s not in self.slots or s in self.free:
                continue
            if profile is not None:
                cur = self.mig.get(s)
                if cur is None:
                    continue
                cur[1] -= 1
                if cur[1] > 0:
                    continue
                del self.mig[s]
            self.free.add(s)
            self.gfree[self.group_of[s]] += 1

    def _use(self, s: int) -> None:
        self.free.discard(s)
        self.gfree[self.group_of[s]] -= 1
