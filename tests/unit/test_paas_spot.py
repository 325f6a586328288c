"""The spot controller's decisions and spot metering: pure arithmetic over a fleet snapshot."""
from __future__ import annotations

from services.paas.domain.spot import (
    RELEASE_BOUND_S,
    FleetSnapshot,
    NodeCapacity,
    SpotSample,
    SpotSettings,
    TenantClaim,
    aggregate,
    decide,
    meter,
)


def node(i: int, free: int, spot: int = 0, total: int = 8, pool: str = "p", offered_at: float | None = None,
         reclaiming: bool = False) -> NodeCapacity:
    return NodeCapacity(f"n{i}", pool, "H100", total, free, spot, offered_at, reclaiming)


def test_offers_only_what_is_free_beyond_guarantees_pending_demand_and_headroom():
    nodes = tuple(node(i, free=8) for i in range(5))                     # 40 free GPUs
    tenants = (TenantClaim("a", "p", guaranteed_unused=8), TenantClaim("b", "p", pending=4))
    d = decide(FleetSnapshot(100.0, nodes, tenants), SpotSettings(headroom_gpus=4))
    # reserve 8 + 4 + 4 = 16: 24 spare, three whole nodes
    assert [o.gpus for o in d.offers] == [8, 8, 8] and not d.reclaims
    assert all(o.until == 100.0 + 3600 for o in d.offers)


def test_whole_node_offers_leave_partly_used_nodes_alone_and_slots_use_them():
    nodes = (node(0, free=6), node(1, free=3))
    assert decide(FleetSnapshot(0, nodes), SpotSettings(headroom_gpus=0)).offers == ()
    offers = decide(FleetSnapshot(0, nodes), SpotSettings(headroom_gpus=1, slot_gpus=2)).offers
    assert [(o.node_id, o.gpus) for o in offers] == [("n0", 6), ("n1", 2)]    # 8 spare, in 2-GPU slots


def test_never_offers_capacity_a_guaranteed_quota_may_still_claim():
    nodes = tuple(node(i, free=8) for i in range(2))
    d = decide(FleetSnapshot(0, nodes, (TenantClaim("a", "p", guaranteed_unused=16),)), SpotSettings(headroom_gpus=0))
    assert d == decide(FleetSnapshot(0, ()), SpotSettings())     # nothing at all


def test_demand_reclaims_the_fewest_nodes_most_recently_offered_first():
    nodes = (node(0, free=0, spot=8, offered_at=10), node(1, free=0, spot=8, offered_at=50),
             node(2, free=0, spot=4, total=4, offered_at=90), node(3, free=2))
    d = decide(FleetSnapshot(200.0, nodes, (TenantClaim("a", "p", pending=6),)), SpotSettings(headroom_gpus=2))
    # reserve 8, free 2: 6 short; one 8-GPU node covers it, the later of the two
    assert [(r.node_id, r.gpus) for r in d.reclaims] == [("n1", 8)] and not d.offers
    assert d.reclaims[0].returned_by == 200.0 + 30 + RELEASE_BOUND_S
    assert d.reclaims[0].mode == "cordon_and_drain"


def test_a_reclaim_under_way_counts_and_is_not_asked_twice():
    nodes = (node(0, free=0, spot=8, reclaiming=True), node(1, free=0, spot=8))
    tenants = (TenantClaim("a", "p", pending=6),)
    assert decide(FleetSnapshot(0, nodes, tenants), SpotSettings(headroom_gpus=2)).reclaims == ()
    tenants = (TenantClaim("a", "p", pending=12),)
    assert [r.node_id for r in decide(FleetSnapshot(0, nodes, tenants), SpotSettings(headroom_gpus=2)).reclaims] == ["n1"]


def test_pools_are_decided_apart():
    nodes = (node(0, free=8, pool="a"), node(1, free=0, spot=8, pool="b"))
    d = decide(FleetSnapshot(0, nodes, (TenantClaim("t", "b", pending=1),)), SpotSettings(headroom_gpus=0, notice_s=120))
    assert [o.node_id for o in d.offers] == ["n0"] and [r.node_id for r in d.reclaims] == ["n1"]
    assert d.reclaims[0].notice_s == 120


def test_metering_makes_one_record_per_constant_run_and_aggregates_by_the_period():
    samples = [SpotSample(0, "n0", "H100", 8, 0), SpotSample(15, "n0", "H100", 8, 0), SpotSample(30, "n0", "H100", 8, 4),
               SpotSample(3600, "n0", "H100", 0, 0), SpotSample(0, "n1", "A100", 4, 4)]
    records = meter(samples, until=7200)
    assert [(r.node_id, r.start, r.end, r.gpus_offered, r.gpus_in_use) for r in records] == [
        ("n0", 0, 30, 8, 0), ("n0", 30, 3600, 8, 4), ("n1", 0, 7200, 4, 4)]
    assert all(r.pricing_category == "Dynamic" for r in records)
    lines = aggregate(records, 0, 3600)
    assert lines["H100"].offered_gpu_h == 8.0 and lines["H100"].in_use_gpu_h == 4 * 3570 / 3600
    assert lines["A100"].in_use_gpu_h == 4.0 and lines["A100"].nodes == {"n1"}
