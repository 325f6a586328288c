"""Placement on the indexed inventory: alignment, atomicity, eligibility, policies (pure, no I/O)."""
from __future__ import annotations

import uuid

import pytest

from services.node_agent.adapters.discovery.sim import sim_topology
from services.scheduler.domain.inventory import Inventory, NodeState, Placement, Pool, Request, SlotTaken
from services.scheduler.domain.shapes import STANDARD_SHAPES as S
from services.scheduler.domain.shapes import Shape
from services.scheduler.domain.topology import derive_slot_map

T = uuid.uuid4()


def node(inv: Inventory, kind="hgx-h100-8", *, pool="shared", approved=True, wipe="nvme-secure-erase",
         taints=None, model=None) -> uuid.UUID:
    name = f"n-{uuid.uuid4().hex[:8]}"
    slot_map, _ = derive_slot_map(sim_topology(name, kind), wipe_policy=wipe)
    state = NodeState(uuid.uuid4(), name, pool, model or slot_map.slots[0].gpu_model, "r1", "s1", "k1",
                      {}, dict(taints or {}), False, slot_map, approved)
    inv.upsert_node(state)
    return state.id


def req(shape="vm.1gpu", *, pool="shared", tol=(), model=None) -> Request:
    sh = S[shape] if model is None else Shape(S[shape].name, S[shape].kind, S[shape].gpu_count, model,
                                               S[shape].mig_profile)
    return Request(uuid.uuid4(), T, sh, pool=pool, tolerations=frozenset(tol))


def take(inv: Inventory, shape="vm.1gpu", **kw) -> Placement | None:
    r = req(shape, **kw)
    p = inv.place(r)
    if p is not None:
        inv.hold(r.allocation_id, r, p)
    return p


def groups(inv: Inventory, p: Placement) -> set[tuple[int, int]]:
    slots = {s.index: s for s in inv.node(p.node_id).state.slot_map.slots}
    return {(slots[i].numa, slots[i].nvlink_domain) for i in p.slots}


@pytest.mark.parametrize("shape", ["vm.2gpu", "vm.4gpu"])
def test_a_slice_lands_on_one_numa_node_and_nvlink_domain(shape):
    inv = Inventory()
    node(inv)
    for _ in range(8 // S[shape].gpu_count):
        p = take(inv, shape)
        assert p.aligned and len(groups(inv, p)) == 1


def test_a_2gpu_slice_prefers_an_aligned_pair_on_another_node_over_crossing_numa():
    inv = Inventory()
    a = node(inv)
    for _ in range(3):      # leave node a with 1 free slot on NUMA 0, 1 on NUMA 1 ... then 2 more
        take(inv, "vm.2gpu")
    take(inv, "vm.1gpu")     # node a: 1 free slot, on the NUMA node holding the 1-GPU slice
    b = node(inv, "pcie-l40s-4", model="H100")   # same pool and model, two aligned pairs
    p = take(inv, "vm.2gpu")
    assert p.node_id == b and p.aligned and len(groups(inv, p)) == 1
    assert len(inv.node(a).free) == 1


def test_a_slice_crosses_numa_on_one_node_only_when_no_node_has_an_aligned_set():
    inv = Inventory()
    n = node(inv, "pcie-l40s-4")        # NVLink pairs: no aligned 4-GPU set exists anywhere
    p = take(inv, "vm.4gpu")
    assert p.node_id == n and not p.aligned and p.slots == (0, 1, 2, 3)


def test_pack_fills_the_busiest_node_that_fits_keeping_whole_nodes_free():
    inv = Inventory()
    a, b = node(inv), node(inv)
    first = take(inv, "vm.1gpu")
    rest = [take(inv, "vm.1gpu") for _ in range(3)]
    assert {p.node_id for p in rest} == {first.node_id}
    whole = take(inv, "vm.8gpu")
    assert whole.node_id == ({a, b} - {first.node_id}).pop() and whole.slots == tuple(range(8))


def test_spread_puts_each_slice_on_the_emptiest_node():
    inv = Inventory()
    inv.set_pool(Pool("shared", "spread"))
    ids = {node(inv) for _ in range(3)}
    assert {take(inv, "vm.1gpu").node_id for _ in range(3)} == ids


def test_single_gpus_fill_a_partly_used_numa_node_before_breaking_an_aligned_block():
    inv = Inventory()
    node(inv)
    four = take(inv, "vm.4gpu")
    one = take(inv, "vm.1gpu")
    two = take(inv, "vm.2gpu")
    assert groups(inv, one) == groups(inv, two) != groups(inv, four)
    assert take(inv, "vm.1gpu") is not None and take(inv, "vm.1gpu") is None


def test_bare_metal_needs_a_node_with_every_slot_free():
    inv = Inventory()
    a, b = node(inv), node(inv)
    used = take(inv, "vm.1gpu").node_id
    p = take(inv, "bm.8gpu")
    assert p.node_id == ({a, b} - {used}).pop() and len(p.slots) == 8
    assert take(inv, "bm.8gpu") is None


def test_an_8gpu_slice_never_takes_part_of_two_nodes():
    inv = Inventory()
    node(inv)
    node(inv)
    take(inv, "vm.4gpu")
    take(inv, "vm.4gpu")    # pack: both on the first node
    assert take(inv, "vm.8gpu") is not None and take(inv, "vm.8gpu") is None


def test_hold_is_atomic_a_taken_slot_fails_the_whole_hold_and_changes_nothing():
    inv = Inventory()
    n = node(inv)
    r1, r2 = req(), req("vm.2gpu")
    inv.hold(r1.allocation_id, r1, Placement(n, "shared", "H100", (1,)))
    before = set(inv.node(n).free)
    with pytest.raises(SlotTaken, match=r"\[1\]"):
        inv.hold(r2.allocation_id, r2, Placement(n, "shared", "H100", (0, 1)))
    assert inv.node(n).free == before and inv.holding(r2.allocation_id) is None


def test_a_placement_is_held_once_and_free_is_idempotent():
    inv = Inventory()
    node(inv)
    r = req("vm.2gpu")
    p = inv.place(r)
    inv.hold(r.allocation_id, r, p)
    inv.hold(r.allocation_id, r, p)          # same answer again: no-op
    with pytest.raises(SlotTaken, match="already holds"):
        inv.hold(r.allocation_id, r, Placement(p.node_id, p.pool, p.gpu_model, (6, 7)))
    assert inv.free(r.allocation_id) == p and inv.free(r.allocation_id) is None
    assert inv.utilisation()[("shared", "H100")] == (0, 8)


def test_a_pool_taint_blocks_requests_without_the_matching_toleration():
    inv = Inventory()
    tenant_pool = Pool("dedicated-x", taints={"tenant": "x:NoSchedule"})
    inv.set_pool(tenant_pool)
    node(inv, pool="dedicated-x")
    assert take(inv, pool="dedicated-x") is None
    assert take(inv, pool="dedicated-x", tol={"tenant=y"}) is None
    assert take(inv, pool="dedicated-x", tol={"tenant=x"}) is not None
    assert take(inv, pool="dedicated-x", tol={"tenant=x:NoSchedule"}) is not None   # the API's full form
    assert take(inv, pool="dedicated-x", tol={"tenant=y:NoSchedule"}) is None
    assert take(inv, pool=None, tol={"tenant"}) is not None     # key-only toleration, any pool


def test_a_node_taint_blocks_requests_without_the_matching_toleration():
    inv = Inventory()
    n = node(inv, taints={"maintenance": "soon"})
    assert take(inv) is None
    assert take(inv, tol={"maintenance=soon"}).node_id == n


def test_a_request_without_a_pool_uses_only_pools_whose_taints_it_tolerates():
    inv = Inventory()
    inv.set_pool(Pool("spot", "spread", {"spot": "true"}))
    spot = node(inv, pool="spot")
    shared = node(inv)
    assert {take(inv, "vm.4gpu", pool=None).node_id for _ in range(2)} == {shared}
    assert take(inv, "vm.4gpu", pool=None) is None
    assert take(inv, "vm.4gpu", pool=None, tol={"spot"}).node_id == spot


def test_a_cordoned_node_gets_no_new_placements_and_keeps_what_it_holds():
    inv = Inventory()
    n = node(inv)
    held = take(inv, "vm.2gpu")
    inv.set_cordoned(n, True)
    assert take(inv) is None and inv.holding(next(iter(inv.holdings()))) is not None
    inv.set_cordoned(n, False)
    assert take(inv).node_id == n and held.node_id == n


def test_an_unapproved_node_and_slots_without_wipe_policy_are_never_placed_on():
    inv = Inventory()
    pending = node(inv, approved=False)
    node(inv, wipe=None)
    assert take(inv) is None
    st = inv.node(pending).state
    st.approved = True
    inv.upsert_node(st)
    assert take(inv).node_id == pending


def test_the_shape_model_and_pool_must_match_the_node():
    inv = Inventory()
    node(inv, "hgx-a100-8")
    assert take(inv, model="H100") is None and take(inv, pool="other") is None
    assert take(inv, model="A100").gpu_model == "A100"


def test_mig_instances_share_a_gpu_up_to_the_profile_capacity():
    inv = Inventory()
    node(inv)
    first = [take(inv, "mig.1g.10gb") for _ in range(7)]
    assert len({p.slots for p in first}) == 1 and first[0].mig_profile == "1g.10gb"
    eighth = take(inv, "mig.1g.10gb")
    assert eighth.slots != first[0].slots
    big = [take(inv, "mig.3g.40gb") for _ in range(2)]
    assert big[0].slots == big[1].slots and big[0].slots not in {first[0].slots, eighth.slots}
    assert take(inv, "vm.8gpu") is None       # partitioned GPUs are not whole-free


def test_mig_shapes_only_land_on_mig_capable_gpus():
    inv = Inventory()
    node(inv, "pcie-l40s-4")
    assert take(inv, "mig.1g.10gb") is None


def test_freeing_the_last_mig_instance_returns_the_whole_gpu():
    inv = Inventory()
    node(inv, "pcie-l40s-4", model="L40S")
    n = node(inv)
    r = req("mig.1g.10gb")
    p = inv.place(r)
    inv.hold(r.allocation_id, r, p)
    assert p.node_id == n and len(inv.node(n).free) == 7
    inv.free(r.allocation_id)
    assert len(inv.node(n).free) == 8 and take(inv, "bm.8gpu").node_id == n


def test_fragmentation_is_the_share_of_free_gpus_on_nodes_that_are_not_entirely_free():
    inv = Inventory()
    node(inv)
    node(inv)
    assert inv.fragmentation() == {("shared", "H100"): 0.0}
    take(inv, "vm.4gpu")
    assert inv.fragmentation() == {("shared", "H100"): pytest.approx(4 / 12)}
    assert inv.utilisation() == {("shared", "H100"): (4, 16)}


def test_upserting_a_node_keeps_its_holdings():
    inv = Inventory()
    n = node(inv)
    p = take(inv, "vm.2gpu")
    inv.upsert_node(inv.node(n).state)
    assert inv.node(n).free == set(range(8)) - set(p.slots)


def test_a_removed_node_that_comes_back_still_has_its_holdings_slots_taken():
    inv = Inventory()
    n = node(inv)
    p = take(inv, "vm.4gpu")
    state = inv.node(n).state
    inv.remove_node(n)
    assert take(inv) is None
    inv.upsert_node(state)
    assert inv.node(n).free == set(range(8)) - set(p.slots)
    assert take(inv, "vm.8gpu") is None


def test_a_request_built_with_a_plain_set_of_tolerations_is_usable():
    inv = Inventory()
    inv.set_pool(Pool("spot", taints={"spot": "true"}))
    node(inv, pool="spot")
    r = Request(uuid.uuid4(), T, S["vm.1gpu"], pool="spot", tolerations={"spot"})
    assert r.tolerations == frozenset({"spot"}) and inv.place(r) is not None
