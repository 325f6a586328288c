"""The in-memory, indexed view of every node and what holds each slot (pure, no I/O).

Placement rules:
- a node is eligible only when approved, not cordoned, in the request's pool (any pool when the
  request names none) and of the shape's GPU model (any when the shape names none), and when the
  request tolerates every taint of the pool and of the node; only slots with a non-empty wipe
  policy exist for placement;
- a 1/2/4-GPU vm slice takes slots of one (NUMA node, NVLink domain) group whenever any eligible
  node has such a set free; only when none has does it cross groups on ONE node (a slice that
  runs slower beats one that waits; ``Placement.aligned`` says which); never across nodes;
- an 8-GPU slice takes 8 free slots of one node (the whole node on an 8-GPU server); bare metal
  needs a node with exactly ``gpu_count`` schedulable slots, all free;
- mig instances go on MIG-capable GPUs, filling an already partitioned GPU of the same profile first;
- per-pool policy ``pack`` (default, best fit: the node with the FEWEST free slots that fits, so
  whole nodes stay free for 8-GPU and bare-metal) or ``spread`` (the MOST free).

Taints and tolerations: see entities.py.

Cost: a decision looks at the partitions eligible for the request (cached) and O(size^2) index
buckets in each (see capacity_index.py); never at every node. Single-threaded, no locking.
"""
from __future__ import annotations

import heapq
import uuid
from collections.abc import Callable
from dataclasses import replace

from .capacity_index import Partition
from .entities import NodeState, Placement, Pool, Request, UnknownNode, tolerates
from .node_slots import NodeSlots, SlotTaken
from .shapes import Shape

__all__ = ["Inventory", "NodeState", "Placement", "Pool", "Request", "SlotTaken", "UnknownNode", "tolerates"]


Admit = Callable[[tuple[str, str]], bool]


class Inventory:
    """Nodes, pools and holdings. ``place`` never mutates; ``hold``/``free`` are the only writers
    of slot state and keep every index up to date in O(1) set moves."""

    def __init__(self) -> None:
        self._nodes: dict[uuid.UUID, NodeSlots] = {}
        self._parts: dict[tuple, Partition] = {}
        self._pools: dict[str, Pool] = {}
        self._holdings: dict[uuid.UUID, tuple[Request, Placement]] = {}
        self._eligible: dict[tuple, tuple[Partition, ...]] = {}
        self._detached: dict[uuid.UUID, dict] = {}    # holdings of removed nodes, by node id

    # ---- nodes and pools
    def upsert_node(self, node: NodeState) -> None:
        """Add or replace a node. Holdings on it are kept and re-applied to the new slot map
        (a holding whose slot disappeared stays recorded until freed). Idempotent."""
        old = self._nodes.get(node.id)
        new = NodeSlots(replace(node, labels=dict(node.labels), taints=dict(node.taints)))
        allocs = self._detached.pop(node.id, {})
        if old is not None:
            self._unindex(old)
            new.reserved_for = old.reserved_for
            allocs = old.allocs
        for aid, (req, p) in allocs.items():
            try:
                new.take(req.shape, p.slots, p.mig_profile)
            except SlotTaken:
                pass
            new.allocs[aid] = (req, p)
            new.prio[_prio_class(req)] += 1
        self._nodes[node.id] = new
        self._index(new)

    def remove_node(self, node_id: uuid.UUID) -> None:
        """Drop a node from placement; holdings on it stay until freed (and hold their slots
        again if the node comes back before). Idempotent."""
        node = self._nodes.pop(node_id, None)
        if node is not None:
            self._unindex(node)
            if node.allocs:
                self._detached[node_id] = node.allocs

    def set_cordoned(self, node_id: uuid.UUID, cordoned: bool) -> None:
        """A cordoned node gets no new placements; what it holds is untouched. Raises UnknownNode."""
        node = self._node(node_id)
        self._unindex(node)
        node.state.cordoned = cordoned
        self._index(node)

    def set_pool(self, pool: Pool) -> None:
        self._pools[pool.name] = pool
        self._eligible.clear()

    def pool(self, name: str) -> Pool:
        return self._pools.get(name) or Pool(name)

    def node(self, node_id: uuid.UUID) -> NodeSlots | None:
        return self._nodes.get(node_id)

    def __len__(self) -> int:
        """Number of nodes in the inventory."""
        return len(self._nodes)

    # ---- holdings
    def hold(self, allocation_id: uuid.UUID, request: Request, placement: Placement) -> None:
        """Mark the placement's slots held by ``allocation_id``, atomically. Holding the same
        placement again is a no-op; raises SlotTaken if a slot is not free or the id holds other
        slots, UnknownNode for an unknown node. On error nothing changes."""
        held = self._holdings.get(allocation_id)
        if held is not None:
            if held[1] == placement:
                return
            raise SlotTaken(f"allocation {allocation_id} already holds slots {held[1].slots} "
                            f"on node {held[1].node_id}")
        node = self._node(placement.node_id)
        node.take(request.shape, placement.slots, placement.mig_profile)
        self._unindex(node)
        node.allocs[allocation_id] = (request, placement)
        node.prio[_prio_class(request)] += 1
        self._holdings[allocation_id] = (request, placement)
        self._index(node)

    def free(self, allocation_id: uuid.UUID) -> Placement | None:
        """Release what ``allocation_id`` holds; its Placement, or None if it held nothing. Idempotent."""
        held = self._holdings.pop(allocation_id, None)
        if held is None:
            return None
        req, p = held
        detached = self._detached.get(p.node_id)
        if detached is not None:
            detached.pop(allocation_id, None)
            if not detached:
                del self._detached[p.node_id]
        node = self._nodes.get(p.node_id)
        if node is not None and node.allocs.pop(allocation_id, None) is not None:
            self._unindex(node)
            node.give(p.slots, p.mig_profile)
            node.prio[_prio_class(req)] -= 1
            self._index(node)
        return p

    def holdings(self) -> dict[uuid.UUID, tuple[Request, Placement]]:
        return dict(self._holdings)

    def holding(self, allocation_id: uuid.UUID) -> tuple[Request, Placement] | None:
        return self._holdings.get(allocation_id)

    # ---- placement
    def place(self, request: Request, *, admit: Admit | None = None) -> Placement | None:
        """Where ``request`` would go now, or None if nothing fits. Does not mutate. ``admit((pool,
        model))`` may veto whole partitions (the scheduler's quota filter)."""
        parts = [p for p in self.eligible(request) if admit is None or admit((p.pool, p.model))]
        if not parts:
            return None
        shape = request.shape
        if shape.kind == "vm":
            gens = [p.vm_candidates(shape.gpu_count, self._pack(p)) for p in parts]
        elif shape.kind == "bare_metal":
            gens = [p.bare_metal_candidates(shape.gpu_count) for p in parts]
        else:
            gens = [p.mig_candidates(shape.mig_profile, self._pack(p)) for p in parts]
        for _, _, ids in (gens[0] if len(gens) == 1 else heapq.merge(*gens)):
            for nid in ids:
                placement = self._pick(self._nodes[nid], shape)
                if placement is not None:
                    return placement
        return None

    def place_on(self, node_id: uuid.UUID, request: Request) -> Placement | None:
        """Where ``request`` would go on this one node (ignoring any reservation of it), or None."""
        node = self._nodes.get(node_id)
        if node is None or node.part not in self.eligible(request) or not _usable(node):
            return None
        return self._pick(node, request.shape)

    def eligible(self, request: Request) -> tuple[Partition, ...]:
        """Partitions whose nodes may host ``request`` by pool, model and taints (cached)."""
        key = (request.pool, request.shape.gpu_model, request.tolerations)
        hit = self._eligible.get(key)
        if hit is None:
            hit = tuple(p for p in self._parts.values()
                        if (request.pool is None or p.pool == request.pool)
                        and (request.shape.gpu_model is None or p.model == request.shape.gpu_model)
                        and tolerates(request.tolerations, self.pool(p.pool).taints)
                        and tolerates(request.tolerations, dict(p.taints)))
            self._eligible[key] = hit
        return hit

    # ---- reservations (anti-starvation; see scheduler.py)
    def reserve(self, node_id: uuid.UUID, allocation_id: uuid.UUID) -> None:
        """Take the node out of normal placement for ``allocation_id`` (backfill may not use it)."""
        node = self._node(node_id)
        self._unindex(node)
        node.reserved_for = allocation_id
        self._index(node)

    def unreserve(self, node_id: uuid.UUID) -> None:
        node = self._nodes.get(node_id)
        if node is not None and node.reserved_for is not None:
            self._unindex(node)
            node.reserved_for = None
            self._index(node)

    def closest_node(self, request: Request, *, admit: Admit | None = None) -> uuid.UUID | None:
        """The placeable eligible node with the most free slots that could ever host the shape."""
        best, best_free = None, -1
        for part in self.eligible(request):
            if admit is not None and not admit((part.pool, part.model)):
                continue
            for ids in part.most_free():
                nid = next((n for n in ids if _could_host(self._nodes[n], request.shape)), None)
                if nid is not None:
                    if len(self._nodes[nid].free) > best_free:
                        best, best_free = nid, len(self._nodes[nid].free)
                    break
        return best

    # ---- metrics (O(nodes): for scrapes, not per decision)
    def fragmentation(self) -> dict[tuple[str, str], float]:
        """(pool, model) -> share of placeable free GPUs on nodes that are not entirely free, i.e.
        that cannot serve the largest shape (8 GPUs / the whole node). 0.0 when nothing is free."""
        free: dict[tuple[str, str], list[int]] = {}
        for node in self._nodes.values():
            if _usable(node) and node.reserved_for is None:
                f = free.setdefault((node.state.pool, node.state.gpu_model), [0, 0])
                f[0] += len(node.free)
                f[1] += len(node.free) if len(node.free) == node.size else 0
        return {k: (1 - whole / total) if total else 0.0 for k, (total, whole) in free.items()}

    def utilisation(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(pool, model) -> (used slots, schedulable slots) over approved nodes."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for node in self._nodes.values():
            if node.state.approved:
                used, total = out.get((node.state.pool, node.state.gpu_model), (0, 0))
                out[(node.state.pool, node.state.gpu_model)] = (used + node.size - len(node.free),
                                                                total + node.size)
        return out

    # ---- internals
    def _pack(self, part: Partition) -> bool:
        pool = self._pools.get(part.pool)
        return pool is None or pool.policy == "pack"

    def _pick(self, node: NodeSlots, shape: Shape) -> Placement | None:
        got = node.pick(shape)
        if got is None:
            return None
        st = node.state
        return Placement(st.id, st.pool, st.gpu_model, got[0], shape.mig_profile, got[1])

    def _node(self, node_id: uuid.UUID) -> NodeSlots:
        node = self._nodes.get(node_id)
        if node is None:
            raise UnknownNode(f"node {node_id} is not in the inventory")
        return node

    def _index(self, node: NodeSlots) -> None:
        st = node.state
        key = (st.pool, st.gpu_model, frozenset(st.taints.items()))
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = Partition(st.pool, st.gpu_model, key[2], len(self._parts))
            self._eligible.clear()
        node.part = part
        if _usable(node):
            part.add(node, placeable=node.reserved_for is None)
        else:
            part.add(node, placeable=False)
            part.members.discard(st.id)

    def _unindex(self, node: NodeSlots) -> None:
        if node.part is not None:
            node.part.remove(node)


def _usable(node: NodeSlots) -> bool:
    return node.state.approved and not node.state.cordoned


def _could_host(node: NodeSlots, shape: Shape) -> bool:
    if shape.kind == "mig":
        return any(s.mig_capable for s in node.slots.values())
    return node.size == shape.gpu_count if shape.kind == "bare_metal" else node.size >= shape.gpu_count


def _prio_class(req: Request) -> tuple:
    """Preemption class of an allocation: spot allocations are ("spot",), others ("p", priority)."""
    return ("spot",) if req.spot else ("p", req.priority)
