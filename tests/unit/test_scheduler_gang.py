"""Gangs in the pure scheduler: all or nothing, one rack and NVLink domain when possible, the fewest racks
otherwise, quota for the whole gang, waiting as one entry that holds nothing, backfill and aging."""
from __future__ import annotations

import uuid

from services.node_agent.adapters.discovery.sim import sim_topology
from services.scheduler.domain.gang import Gang
from services.scheduler.domain.inventory import Inventory, NodeState, Request
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


def world(racks: dict[str, int], *, aging_s=60.0, max_per_tenant=100):
    """A scheduler over ``racks`` (rack name -> its node count) and one tenant with a big quota."""
    inv, clock, nodes = Inventory(), Clock(), {}
    for rack, n in racks.items():
        for _ in range(n):
            name = f"n-{uuid.uuid4().hex[:8]}"
            st = NodeState(uuid.uuid4(), name, "shared", "H100", "r", "s", rack, {}, {}, False,
                           derive_slot_map(sim_topology(name))[0], True)
            inv.upsert_node(st)
            nodes[st.id] = rack
    sched = Scheduler(inv, QuotaBook(), FairQueue(max_per_tenant=max_per_tenant), aging_s=aging_s, clock=clock)
    t = uuid.uuid4()
    sched.quotas.set_limit(QuotaKey(t, "H100", "shared"), 10_000)
    return sched, t, nodes, clock


def gang(t, n, shape="bm.8gpu", **kw) -> Gang:
    return Gang(Request(uuid.uuid4(), t, S[shape], pool="shared", **kw), tuple(uuid.uuid4() for _ in range(n)))


def single(sched, t, shape="vm.1gpu"):
    r = Request(uuid.uuid4(), t, S[shape], pool="shared")
    return r, sched.submit(r)


def test_a_gang_that_fits_is_placed_whole_in_one_rack():
    for _ in range(5):                        # node sets iterate in any order: the rack scan must decide
        sched, t, nodes, _ = world({f"rack-{i}": 2 for i in range(6)})
        g = gang(t, 2)
        d = sched.submit_gang(g)
        assert d.kind == "placed" and d.placement.racks == 1
        assert {nodes[p.node_id] for p in d.placement.placements} == {nodes[d.placement.placements[0].node_id]}
        assert all(sched.inv.holding(m) for m in g.members)
        assert sched.quotas.used(QuotaKey(t, "H100", "shared")) == 16


def test_small_members_share_one_node_and_one_nvlink_domain():
    sched, t, _, _ = world({"a": 2})
    d = sched.submit_gang(gang(t, 4, "vm.2gpu"))
    assert d.kind == "placed" and d.placement.racks == 1 and d.placement.nvlink_domains == 1
    assert len({p.node_id for p in d.placement.placements}) == 1


def test_a_gang_larger_than_any_rack_takes_the_fewest_racks():
    sched, t, nodes, _ = world({"one": 1, "three": 3, "two": 2, "also-one": 1})
    d = sched.submit_gang(gang(t, 5))
    assert d.kind == "placed" and d.placement.racks == 2
    assert sorted(nodes[p.node_id] for p in d.placement.placements) == ["three"] * 3 + ["two"] * 2


def test_a_gang_that_does_not_fit_holds_nothing_waits_and_is_placed_whole_when_capacity_appears():
    sched, t, _, _ = world({"a": 2})
    blocker, _ = single(sched, t)
    g = gang(t, 2)
    d = sched.submit_gang(g)
    assert d.kind == "queued" and "waits whole" in d.reason
    assert [a for a in sched.inv.holdings()] == [blocker.allocation_id]
    assert sched.submit_gang(g).kind == "queued" and len(sched.queue) == 1        # idempotent: one entry
    assert sched.release(blocker.allocation_id) == []          # singles only: the gang is drained apart
    [gp] = sched.take_placed_gangs()
    assert gp.gang.gang_id == g.gang_id and all(sched.inv.holding(m) for m in g.members)
    assert g.gang_id not in sched.queue and not sched.gangs
    again = sched.submit_gang(g)
    assert again.kind == "placed" and again.placement.placements == gp.placements


def test_quota_is_checked_for_the_whole_gang():
    sched, _, _, _ = world({"a": 4})
    t = uuid.uuid4()
    sched.quotas.set_limit(QuotaKey(t, "H100", "shared"), 31)
    d = sched.submit_gang(gang(t, 4))
    assert d.kind == "rejected" and d.code == "quota-exceeded"
    assert d.quota_verdict.requested == 32 and d.quota_verdict.limit == 31 and not sched.inv.holdings()


def test_fail_fast_and_the_queue_bound_count_the_gang_as_one_request():
    sched, t, _, _ = world({"a": 1}, max_per_tenant=1)
    single(sched, t)
    assert sched.submit_gang(gang(t, 2, fail_fast=True)).code == "no-capacity"
    assert sched.submit_gang(gang(t, 2)).kind == "queued"
    assert sched.submit_gang(gang(t, 2)).code == "queue-full"


def test_a_cancelled_gang_is_never_placed():
    sched, t, _, _ = world({"a": 2})
    blocker, _ = single(sched, t)
    g = gang(t, 2)
    sched.submit_gang(g)
    assert sched.cancel_gang(g.gang_id).gang_id == g.gang_id and sched.cancel_gang(g.gang_id) is None
    sched.release(blocker.allocation_id)
    assert sched.take_placed_gangs() == [] and not sched.inv.holdings()


def test_smaller_requests_backfill_behind_a_waiting_gang_until_it_ages_and_reserves_a_node():
    sched, t, nodes, clock = world({"a": 2}, aging_s=30)
    whole, _ = single(sched, t, "vm.8gpu")                              # one node full
    small, _ = single(sched, t)                                         # one GPU of the other
    g = gang(t, 2)
    assert sched.submit_gang(g).kind == "queued"
    backfill, d = single(sched, t)
    assert d.kind == "placed"                                           # backfill: the gang blocks nobody
    clock.now += 31
    sched.tick()
    reserved = sched.reservations[g.gang_id]                            # aged: it drains the freer node
    assert reserved == sched.inv.holding(small.allocation_id)[1].node_id
    sched.release(small.allocation_id)
    sched.release(backfill.allocation_id)
    late, d = single(sched, t)
    assert d.kind == "queued"                                           # the drained node is kept for the gang
    sched.release(whole.allocation_id)
    [gp] = sched.take_placed_gangs()
    assert {p.node_id for p in gp.placements} == set(nodes) and g.gang_id not in sched.reservations
    assert late.allocation_id in sched.queue


def test_a_waiting_gang_whose_member_reserved_on_its_own_is_skipped_not_broken():
    sched, t, _, _ = world({"a": 2})
    whole, _ = single(sched, t, "vm.8gpu")
    single(sched, t)                                       # 7 GPUs left: one 4-GPU member fits, not two
    g = gang(t, 2, "vm.4gpu")
    assert sched.submit_gang(g).kind == "queued"
    own = Request(g.members[0], t, S["vm.4gpu"], pool="shared")
    assert sched.submit(own).kind == "placed"              # its own saga came first
    sched.release(whole.allocation_id)
    assert g.gang_id in sched.gangs and sched.take_placed_gangs() == []
