"""The scheduler as a whole: quotas, waiting, fairness, starvation, preemption (pure, no I/O)."""
from __future__ import annotations

import uuid

from services.node_agent.adapters.discovery.sim import sim_topology
from services.scheduler.domain.inventory import Inventory, NodeState, Request
from services.scheduler.domain.preemption import select_victims
from services.scheduler.domain.queue import FairQueue
from services.scheduler.domain.quota import QuotaBook, QuotaKey
from services.scheduler.domain.scheduler import Scheduler
from services.scheduler.domain.shapes import STANDARD_SHAPES as S
from services.scheduler.domain.topology import derive_slot_map


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def world(nodes=1, *, max_per_tenant=100, aging_s=60.0):
    inv, quotas, clock = Inventory(), QuotaBook(), Clock()
    ids = []
    for _ in range(nodes):
        name = f"n-{uuid.uuid4().hex[:8]}"
        slot_map, _ = derive_slot_map(sim_topology(name))
        st = NodeState(uuid.uuid4(), name, "shared", "H100", "r", "s", "k", {}, {}, False, slot_map, True)
        inv.upsert_node(st)
        ids.append(st.id)
    sched = Scheduler(inv, quotas, FairQueue(max_per_tenant=max_per_tenant), aging_s=aging_s, clock=clock)
    return sched, ids, clock


def tenant(sched: Scheduler, limit=1000, guaranteed=0) -> uuid.UUID:
    t = uuid.uuid4()
    sched.quotas.set_limit(QuotaKey(t, "H100", "shared"), limit, guaranteed)
    return t


def ask(sched, t, shape="vm.1gpu", **kw):
    r = Request(uuid.uuid4(), t, S[shape], pool="shared", **kw)
    return r, sched.submit(r)


def test_a_placed_request_holds_its_slots_and_is_charged_to_its_quota():
    sched, _, _ = world()
    t = tenant(sched, limit=8)
    r, d = ask(sched, t, "vm.4gpu")
    assert d.kind == "placed" and sched.inv.holding(r.allocation_id)[1] == d.placement
    assert sched.quotas.used(QuotaKey(t, "H100", "shared")) == 4 and sched.usage == {t: 4}
    assert sched.submit(r).placement == d.placement       # idempotent


def test_the_quota_boundary_admits_the_last_gpu_and_rejects_one_more_naming_the_quota():
    sched, _, _ = world(2)
    t = tenant(sched, limit=9)
    assert [ask(sched, t, s)[1].kind for s in ("vm.8gpu", "vm.1gpu")] == ["placed", "placed"]
    _, d = ask(sched, t, "vm.1gpu")
    assert d.kind == "rejected" and d.quota_verdict.limit == 9 and d.quota_verdict.used == 9
    assert f"tenant/{t}/H100/shared" in d.reason


def test_a_tenant_without_quota_is_rejected_and_nothing_is_held():
    sched, _, _ = world()
    _, d = ask(sched, uuid.uuid4())
    assert d.kind == "rejected" and d.quota_verdict.limit is None and not sched.inv.holdings()


def test_when_nothing_fits_a_request_waits_or_fails_fast_and_is_placed_on_release():
    sched, _, _ = world()
    t = tenant(sched)
    first, _ = ask(sched, t, "vm.8gpu")
    assert ask(sched, t, "vm.4gpu", fail_fast=True)[1].kind == "rejected"
    waiting, d = ask(sched, t, "vm.4gpu")
    assert d.kind == "queued" and "no capacity" in d.reason
    placed = sched.release(first.allocation_id)
    assert [r.allocation_id for r, _ in placed] == [waiting.allocation_id]
    assert sched.inv.holding(waiting.allocation_id) is not None and len(sched.queue) == 0


def test_a_cancelled_request_is_never_placed():
    sched, _, _ = world()
    t = tenant(sched)
    first, _ = ask(sched, t, "vm.8gpu")
    waiting, _ = ask(sched, t, "vm.8gpu")
    assert sched.cancel(waiting.allocation_id).allocation_id == waiting.allocation_id
    assert sched.release(first.allocation_id) == [] and sched.inv.holding(waiting.allocation_id) is None


def test_tenant_b_waits_for_one_release_although_tenant_a_flooded_the_queue():
    sched, _, _ = world(max_per_tenant=500)
    a, b = tenant(sched), tenant(sched)
    running = [ask(sched, a)[0] for _ in range(8)]
    for _ in range(500):
        assert ask(sched, a)[1].kind == "queued"
    assert ask(sched, a)[1].kind == "rejected"           # the bound: no 501st pending request
    mine, d = ask(sched, b)
    assert d.kind == "queued"
    placed = sched.release(running[0].allocation_id)
    assert [r.allocation_id for r, _ in placed] == [mine.allocation_id]


def test_a_waiting_8gpu_request_is_not_starved_by_backfilled_small_ones():
    sched, nodes, clock = world(2, aging_s=60)
    small, big = tenant(sched), tenant(sched)
    running = [ask(sched, small)[0] for _ in range(12)]    # pack: one node full, 4 on the other
    partial = next(n for n in nodes if len(sched.inv.node(n).free) == 4)
    large, d = ask(sched, big, "vm.8gpu")
    assert d.kind == "queued"
    clock.now += 61
    assert sched.tick() == [] and sched.reservations[large.allocation_id] == partial
    for _ in range(20):                # small ones keep coming: none may take its free slots
        r, d = ask(sched, small)
        assert d.kind == "queued" or d.placement.node_id != partial
    assert len(sched.inv.node(partial).free) == 4
    on_partial = [r for r in running if sched.inv.holding(r.allocation_id)[1].node_id == partial]
    placed = []
    for r in on_partial:
        placed += sched.release(r.allocation_id)
    assert (large.allocation_id, partial) in [(r.allocation_id, p.node_id) for r, p in placed]
    assert large.allocation_id not in sched.reservations


def test_preemption_takes_spot_before_lower_priority_and_the_fewest_victims_on_one_node():
    sched, _, _ = world(2)
    low, spot, vip = tenant(sched), tenant(sched), tenant(sched)
    low_allocs = [ask(sched, low, "vm.4gpu", priority=0)[0] for _ in range(2)]      # one node
    spot_allocs = [ask(sched, spot, "vm.2gpu", spot=True)[0] for _ in range(4)]    # the other
    spot_node = sched.inv.holding(spot_allocs[0].allocation_id)[1].node_id
    urgent, d = ask(sched, vip, "vm.4gpu", priority=10)
    assert d.kind == "queued" and len(d.victims) == 2     # two spot ones, not one regular 4-GPU
    assert set(d.victims) <= {r.allocation_id for r in spot_allocs}
    victim_nodes = {sched.inv.holding(v)[1].node_id for v in d.victims}
    assert victim_nodes == {spot_node} and sched.reservations[urgent.allocation_id] == spot_node
    assert all(sched.inv.holding(r.allocation_id) for r in low_allocs)
    placed = []
    for v in d.victims:
        placed += sched.release(v)
    assert [(r.allocation_id, p.node_id) for r, p in placed] == [(urgent.allocation_id, spot_node)]


def test_preemption_never_cuts_into_a_tenants_guaranteed_quota():
    sched, _, _ = world(1)
    guarded, vip = tenant(sched, guaranteed=6), tenant(sched)
    [ask(sched, guarded, "vm.2gpu") for _ in range(4)]
    r = Request(uuid.uuid4(), vip, S["vm.4gpu"], priority=5, pool="shared")
    assert select_victims(sched.inv, sched.quotas, r) is None       # 8 - 4 < 6: not allowed
    one = Request(uuid.uuid4(), vip, S["vm.2gpu"], priority=5, pool="shared")
    assert len(select_victims(sched.inv, sched.quotas, one)) == 1   # 8 - 2 >= 6: allowed


def test_equal_priority_and_spot_requests_preempt_nothing():
    sched, _, _ = world(1)
    a, b = tenant(sched), tenant(sched)
    ask(sched, a, "vm.8gpu", priority=3)
    assert ask(sched, b, "vm.1gpu", priority=3)[1].victims == ()
    spot_req = Request(uuid.uuid4(), b, S["vm.1gpu"], priority=9, spot=True, pool="shared")
    assert select_victims(sched.inv, sched.quotas, spot_req) is None


def test_an_allocation_already_being_preempted_is_not_chosen_twice():
    sched, _, _ = world(1)
    low, vip = tenant(sched), tenant(sched)
    [ask(sched, low, "vm.4gpu") for _ in range(2)]
    first = ask(sched, vip, "vm.4gpu", priority=5)[1]
    second = ask(sched, vip, "vm.4gpu", priority=5)[1]
    assert len(first.victims) == 1 and second.victims == ()


def test_capacity_freed_by_preemption_goes_to_the_preemptor_not_to_backfill():
    sched, _, _ = world(1)
    spot, other, vip = tenant(sched), tenant(sched), tenant(sched)
    spots = [ask(sched, spot, "vm.4gpu", spot=True)[0] for _ in range(2)]
    urgent, d = ask(sched, vip, "vm.4gpu", priority=10)
    assert len(d.victims) == 1
    _, small = ask(sched, other, "vm.1gpu")
    assert small.kind == "queued"                      # the node is reserved for the preemptor
    placed = sched.release(d.victims[0])
    assert [r.allocation_id for r, _ in placed] == [urgent.allocation_id]
    survivor = next(r for r in spots if r.allocation_id != d.victims[0])
    assert sched.inv.holding(survivor.allocation_id) is not None


def test_adopted_holdings_count_against_quota_and_slots():
    sched, nodes, _ = world(1)
    t = tenant(sched, limit=8)
    r = Request(uuid.uuid4(), t, S["vm.8gpu"], pool="shared")
    p = sched.inv.place(r)
    sched.adopt(r, p)
    sched.adopt(r, p)                                  # idempotent
    assert sched.quotas.used(QuotaKey(t, "H100", "shared")) == 8
    assert ask(sched, t)[1].kind == "rejected" and p.node_id == nodes[0]


def check_invariants(sched: Scheduler) -> None:
    """No slot is held twice, every held slot is off the free list, quota use equals holdings."""
    per_slot: dict[tuple, list] = {}
    use: dict[QuotaKey, int] = {}
    for r, p in sched.inv.holdings().values():
        for s in p.slots:
            per_slot.setdefault((p.node_id, s), []).append(r)
        key = QuotaKey(r.tenant_id, p.gpu_model, p.pool)
        use[key] = use.get(key, 0) + r.shape.quota_units
    for (nid, s), holders in per_slot.items():
        assert s not in sched.inv.node(nid).free
        if len(holders) > 1:
            assert {h.shape.mig_profile for h in holders} != {None}
            assert len(holders) <= holders[0].shape.mig_per_gpu
    for key, n in use.items():
        assert sched.quotas.used(key) == n <= sched.quotas.limit(key)
    for aid, nid in sched.reservations.items():      # a reservation belongs to a pending request
        assert aid in sched.queue and sched.inv.node(nid).reserved_for == aid


def test_a_random_stream_never_double_books_a_slot_or_exceeds_a_quota():
    import random
    rng = random.Random(1234)
    sched, _, clock = world(6, aging_s=5)
    tenants = [tenant(sched, limit=rng.choice((16, 24, 32)), guaranteed=rng.choice((0, 4))) for _ in range(6)]
    live = []
    shapes = ["vm.1gpu", "vm.2gpu", "vm.4gpu", "vm.8gpu", "bm.8gpu", "mig.1g.10gb", "mig.3g.40gb"]
    for step in range(1500):
        clock.now += 1
        if live and rng.random() < 0.45:
            placed = sched.release(live.pop(rng.randrange(len(live))))
        else:
            r, d = ask(sched, rng.choice(tenants), rng.choice(shapes), priority=rng.choice((0, 0, 1, 2)),
                       spot=rng.random() < 0.2)
            placed = [(r, d.placement)] if d.kind == "placed" else []
            for v in d.victims:
                if v in live:
                    live.remove(v)
                    placed += sched.release(v)
        if step % 50 == 0:
            placed += sched.tick()
        live += [r.allocation_id for r, _ in placed]
        assert set(live) == set(sched.inv.holdings())
        check_invariants(sched)


def test_releasing_twice_or_an_unknown_allocation_changes_nothing():
    sched, _, _ = world(1)
    t = tenant(sched)
    r, _ = ask(sched, t, "vm.4gpu")
    sched.release(r.allocation_id)
    assert sched.release(r.allocation_id) == [] and sched.release(uuid.uuid4()) == []
    assert sched.usage == {} and sched.quotas.used(QuotaKey(t, "H100", "shared")) == 0


def test_an_over_quota_rejection_names_the_quota_the_tenant_has_not_a_missing_one():
    sched, _, _ = world(1)
    name = "n-other"
    slot_map, _ = derive_slot_map(sim_topology(name))
    sched.inv.upsert_node(NodeState(uuid.uuid4(), name, "a-pool", "H100", "r", "s", "k", {}, {}, False,
                                    slot_map, True))
    t = tenant(sched, limit=2)                       # a quota on shared only, none on a-pool
    r = Request(uuid.uuid4(), t, S["vm.4gpu"])       # any pool
    d = sched.submit(r)
    assert d.kind == "rejected" and d.quota_verdict.quota == f"tenant/{t}/H100/shared"
    assert d.quota_verdict.limit == 2


def test_unplacing_a_placement_the_database_refused_frees_it_without_serving_the_queue():
    sched, _, _ = world()
    t = tenant(sched, limit=16)
    whole, _ = ask(sched, t, "vm.8gpu")
    waiting, d = ask(sched, t, "vm.1gpu")
    assert d.kind == "queued"
    sched.unplace(whole.allocation_id)
    assert sched.inv.holding(whole.allocation_id) is None and sched.usage == {}
    assert sched.quotas.used(QuotaKey(t, "H100", "shared")) == 0
    assert sched.inv.holding(waiting.allocation_id) is None      # unlike release: the queue is not re-run
    sched.unplace(whole.allocation_id)                           # idempotent


def test_the_spot_reserve_is_unused_guarantees_plus_pending_non_spot_gpus_and_any_pool_counts_everywhere():
    sched, _, _ = world(1)
    assert sched.spot_reserve() == {"shared": 0}
    t = tenant(sched, guaranteed=6)
    ask(sched, t, "vm.4gpu")                                   # placed: 2 of its 6 guaranteed GPUs still claimable
    assert sched.spot_reserve() == {"shared": 2}
    hog = tenant(sched)
    ask(sched, hog, "vm.4gpu")                                 # the node is full now
    _, waiting = ask(sched, hog, "vm.8gpu")
    _, spot = ask(sched, hog, "vm.8gpu", spot=True)            # spot waits too, but claims nothing
    anywhere = Request(uuid.uuid4(), hog, S["vm.1gpu"])
    assert waiting.kind == spot.kind == sched.submit(anywhere).kind == "queued"
    assert sched.spot_reserve() == {"shared": 2 + 8 + 1}
