"""A live spot offering's decisions (pure): grow into spare GPUs one step at a time, reclaim what tenants may
claim, never count the same GPUs twice."""
from __future__ import annotations

import uuid

from services.paas.domain import offering as dom
from services.paas.domain.offering import Offering


def offer(**over) -> Offering:
    return Offering(pool="shared", tenant_id=uuid.uuid4(), user_id=uuid.uuid4(), shape="vm.8gpu", gpu_count=8,
                    cluster_name="tessera-shared", **over)


def placed(off: Offering, count: int, at: float) -> list[dom.SpotNode]:
    nodes = dom.grow(off, count, at)
    for i, n in enumerate(nodes):
        dom.activated(off, n, uuid.UUID(int=i + 1), at + 1 + i)
    return nodes


def test_it_grows_by_whole_nodes_into_what_is_free_beyond_the_reserve_and_headroom():
    off = offer(headroom_gpus=4)
    d = dom.decide(off, free=40, reserve=10, figures_at=1.0)
    assert d.grow == 3 and not d.reclaim and off.reserve_gpus == 14      # (40 - 14) // 8


def test_it_waits_for_figures_newer_than_its_last_change_and_for_its_requests_to_be_placed():
    off = offer()
    nodes = dom.grow(off, 2, at := 100.0)
    assert dom.decide(off, free=64, reserve=0, figures_at=at - 1).grow == 0   # taken before it asked
    assert dom.decide(off, free=64, reserve=0, figures_at=at + 1).grow == 0   # its requests not placed yet
    for n in nodes:
        dom.activated(off, n, uuid.uuid4(), at + 2)
    assert dom.decide(off, free=48, reserve=0, figures_at=at + 3).grow == 6


def test_it_never_grows_past_max_nodes():
    off = offer(max_nodes=3)
    placed(off, 2, 10.0)
    assert dom.decide(off, free=64, reserve=0, figures_at=20.0).grow == 1


def test_a_shortfall_reclaims_the_fewest_newest_offers_and_counts_those_on_their_way_back():
    off = offer()
    first, second, third = placed(off, 3, 10.0)
    d = dom.decide(off, free=0, reserve=9, figures_at=20.0)
    assert d.reclaim == [third, second]                                    # ⌈9 / 8⌉ = 2, newest first
    dom.reclaim(off, third, 21.0, by=51.0, reason="r", release_due=True)
    assert dom.decide(off, free=0, reserve=9, figures_at=22.0).reclaim == [second]   # 8 already coming back
    assert off.reclaims_total == 1 and third.state == "reclaiming" and first.state == "offered"


def test_a_reclaim_is_released_by_the_offering_only_at_the_notices_end_and_only_once():
    off = offer()
    [node] = placed(off, 1, 10.0)
    dom.reclaim(off, node, 20.0, by=50.0, reason="r", release_due=True)
    assert dom.due_releases(off, 49.9) == [] and dom.due_releases(off, 50.0) == [node]
    node.release_sent = True
    assert dom.due_releases(off, 60.0) == []


def test_a_scheduler_preemption_is_not_released_by_the_offering():
    off = offer()
    [node] = placed(off, 1, 10.0)
    assert dom.reclaim(off, node, 20.0, by=50.0, reason="preempted", release_due=False)
    assert not dom.reclaim(off, node, 21.0, by=60.0, reason="again", release_due=True)   # once
    assert dom.due_releases(off, 100.0) == []


def test_disabling_reclaims_what_is_offered_and_a_node_placed_afterwards_at_once():
    off = offer()
    nodes = dom.grow(off, 2, 10.0)
    dom.activated(off, nodes[0], uuid.uuid4(), 11.0)
    dom.disable(off, 12.0)
    assert [n.state for n in nodes] == ["reclaiming", "requested"]
    dom.activated(off, nodes[1], uuid.uuid4(), 13.0)
    assert nodes[1].state == "reclaiming" and nodes[1].reclaim_by == 13.0 + off.notice_s
    assert dom.decide(off, free=64, reserve=0, figures_at=20.0).grow == 0


def test_held_gpu_seconds_run_from_the_offer_to_the_end_and_survive_pruning():
    off = offer()
    nodes = placed(off, dom.KEEP_ENDED + 2, 0.0)
    for n in nodes:
        dom.ended(off, n, "released", n.offered_at + 100)
    assert len(off.nodes) == dom.KEEP_ENDED
    assert off.held_gpu_s(10_000) == len(nodes) * 8 * 100


def test_the_market_is_told_of_offers_and_reclaims_but_not_of_requests_or_unplaced_ends():
    off = offer()
    a, b = dom.grow(off, 2, 0.0)
    assert dom.untold(off) == []
    dom.activated(off, a, uuid.uuid4(), 1.0)
    dom.ended(off, b, "failed", 2.0)
    assert dom.untold(off) == [a]
