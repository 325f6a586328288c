"""The index's per-rack room counts stay equal to a recount of the nodes after every change (pure, no I/O).

Random holds, releases, cordons (a drain cordons), reservations, removals and node changes (rack, approval,
taints) are applied to one inventory; after each, every partition's per-rack table and every rack's room
for 1/2/4/8-GPU and bare-metal members are compared with a recount over the nodes themselves.
"""
from __future__ import annotations

import random
import uuid
from dataclasses import replace

import pytest

from services.node_agent.adapters.discovery.sim import sim_topology
from services.scheduler.domain.gang import _candidate_racks, _in_turn
from services.scheduler.domain.inventory import Inventory, NodeState, Request
from services.scheduler.domain.shapes import STANDARD_SHAPES as S
from services.scheduler.domain.topology import derive_slot_map

T = uuid.uuid4()
KINDS = ("hgx-h100-8", "dgx2-v100-16")
SHAPES = ("vm.1gpu", "vm.2gpu", "vm.4gpu", "vm.8gpu", "bm.8gpu")
MEMBERS = ((1, False), (2, False), (4, False), (8, False), (8, True), (16, True))


def a_node(rng: random.Random) -> NodeState:
    name = f"n-{uuid.uuid4().hex[:8]}"
    slot_map, _ = derive_slot_map(sim_topology(name, rng.choice(KINDS)))
    taints = {"gpu": "reserved"} if rng.random() < 0.2 else {}
    return NodeState(uuid.uuid4(), name, "shared", slot_map.slots[0].gpu_model, "r", "s", f"rack-{rng.randrange(5)}",
                     {}, taints, False, slot_map, True)


def recount(inv: Inventory, ids: set[uuid.UUID]) -> dict[tuple, dict[str, dict[tuple[int, int], set[uuid.UUID]]]]:
    """(pool, model, taints) -> rack -> (size, free) -> placeable node ids with a free slot, from the nodes."""
    out: dict = {}
    for nid in ids:
        node = inv.node(nid)
        st = node.state
        if st.approved and not st.cordoned and node.reserved_for is None and node.size and node.free:
            key = (st.pool, st.gpu_model, frozenset(st.taints.items()))
            out.setdefault(key, {}).setdefault(st.rack, {}).setdefault((node.size, len(node.free)), set()).add(nid)
    return out


def room_recount(inv: Inventory, ids: set[uuid.UUID], k: int, bare: bool) -> dict[tuple, dict[str, int]]:
    out: dict = {}
    for nid in ids:
        node = inv.node(nid)
        st = node.state
        if not (st.approved and not st.cordoned and node.reserved_for is None):
            continue
        f = len(node.free)
        r = (node.size == k and f == k) if bare else f // k
        if r:
            racks = out.setdefault((st.pool, st.gpu_model), {})
            racks[st.rack] = racks.get(st.rack, 0) + int(r)
    return out


def first_node(inv: Inventory, ids: set[uuid.UUID], pair: tuple, rack: str, k: int, bare: bool) -> tuple[int, int]:
    """A rack's first node as the scan over every node ordered racks of equal room: (fewest free slots, id)."""
    return min((len(n.free), n.state.id.int) for n in map(inv.node, ids)
               if (n.state.pool, n.state.gpu_model) == pair and n.state.rack == rack and n.state.approved
               and not n.state.cordoned and n.reserved_for is None and len(n.free) >= k
               and (not bare or len(n.free) == n.size == k))


def check(inv: Inventory, ids: set[uuid.UUID]) -> None:
    parts = {(p.pool, p.model, p.taints): p for p in inv._parts.values()}
    got = {key: p.racks for key, p in parts.items() if p.racks}
    assert got == recount(inv, ids)
    for k, bare in MEMBERS:
        counted: dict = {}
        for p in parts.values():
            for rack, room, low in p.rack_room(k, bare):
                racks = counted.setdefault((p.pool, p.model), {})
                racks[rack] = racks.get(rack, 0) + room
                assert low == min(f for (size, f), s in p.racks[rack].items() if s and f >= k
                                  and (not bare or f == size == k))
        assert counted == room_recount(inv, ids, k, bare)
        for pair, racks in counted.items():
            same = [p for p in parts.values() if (p.pool, p.model) == pair]
            order = _candidate_racks(same, k, bare)
            assert {rack: r for r, _, rack in order} == racks
            assert [r for r, _, _ in order] == sorted(racks.values())
            expected = sorted(racks, key=lambda rack: (racks[rack], first_node(inv, ids, pair, rack, k, bare)))
            assert [rack for _, rack in _in_turn(order, same, k, bare)] == expected
            assert [rack for _, rack in _in_turn(order, same, k, bare, roomiest=True)] == expected[::-1]


@pytest.mark.parametrize("seed", range(6))
def test_rack_room_counts_equal_a_recount_after_every_change(seed):
    rng = random.Random(seed)
    inv = Inventory()
    states: dict[uuid.UUID, NodeState] = {}
    held: dict[uuid.UUID, uuid.UUID] = {}          # allocation -> node
    for _ in range(24):
        st = a_node(rng)
        states[st.id] = st
        inv.upsert_node(st)
    check(inv, set(states))
    for _ in range(400):
        op = rng.random()
        nid = rng.choice(list(states))
        if op < 0.45:
            r = Request(uuid.uuid4(), T, S[rng.choice(SHAPES)], pool="shared")
            p = inv.place(r)
            if p is not None:
                inv.hold(r.allocation_id, r, p)
                held[r.allocation_id] = p.node_id
        elif op < 0.7 and held:
            aid = rng.choice(list(held))
            inv.free(aid)
            del held[aid]
        elif op < 0.78:
            if nid in inv._nodes:
                inv.set_cordoned(nid, not inv.node(nid).state.cordoned)
        elif op < 0.86:
            if nid in inv._nodes:
                if inv.node(nid).reserved_for is None:
                    inv.reserve(nid, uuid.uuid4())
                else:
                    inv.unreserve(nid)
        elif op < 0.92:
            inv.remove_node(nid)
        else:     # the node comes back or changes: another rack, approval or taints; holdings kept
            st = replace(states[nid], rack=f"rack-{rng.randrange(5)}", approved=rng.random() < 0.8,
                         taints={"gpu": "reserved"} if rng.random() < 0.2 else {})
            states[nid] = st
            inv.upsert_node(st)
        check(inv, {n for n in states if inv.node(n) is not None})
    for aid in list(held):
        inv.free(aid)
    check(inv, {n for n in states if inv.node(n) is not None})
