"""The autoscaler's decisions on a fake clock: samples every 5 s, a decision every 15 s (the NVCF loop). The
surge rule (a step in load acted on within 20 s) has its own file, test_paas_autoscale_surge.py."""
from __future__ import annotations

import random
import uuid

import pytest

from services.paas.domain.autoscale import (
    TICK_S,
    WINDOW_S,
    ClusterState,
    Hold,
    NodeSample,
    Sample,
    ScaleIn,
    ScaleOut,
    ScalingPolicy,
    Window,
    decide,
)
from services.paas.handlers.autoscale import Autoscaler
from tests.support.bus import make_envelope

SAMPLE_S = 5.0


def policy(**overrides) -> ScalingPolicy:
    values = {"min_nodes": 1, "max_nodes": 4, "target_gpu_util": 0.7, "cooldown_s": 300.0}
    return ScalingPolicy(**(values | overrides))


def nodes(n: int) -> tuple[str, ...]:
    return tuple(f"c-{i}" for i in range(n))


def sample(at: float, utils: dict[str, float], jobs: dict[str, int] | None = None) -> Sample:
    jobs = jobs or {}
    return Sample(at, tuple(NodeSample(name, u, running_jobs=jobs.get(name, 1 if u > 0 else 0))
                            for name, u in utils.items()))


def feed(window: Window, start: float, end: float, utils) -> None:
    """Samples every SAMPLE_S in [start, end); ``utils(t)`` gives each node's utilisation."""
    t = start
    while t < end:
        window.add(sample(t, utils(t)))
        t += SAMPLE_S


# --- Window --------------------------------------------------------------------------------------------------

def test_the_window_keeps_only_its_span_and_weights_by_gpus():
    window = Window()
    window.add(Sample(0.0, (NodeSample("a", 1.0, gpus=3), NodeSample("b", 0.0, gpus=1))))
    assert window.mean_util(0.0) == pytest.approx(0.75)
    window.add(Sample(60.0, (NodeSample("a", 0.0, gpus=3), NodeSample("b", 0.0, gpus=1))))
    assert window.mean_util(60.0) == pytest.approx(0.375)
    assert window.mean_util(WINDOW_S + 1) == pytest.approx(0.0)     # the first sample has left the window
    assert len(window) == 1
    assert window.mean_util(200.0) is None


def test_the_window_holds_a_bounded_number_of_entries_however_long_it_runs():
    window = Window()
    feed(window, 0.0, 3600.0, lambda t: {n: 0.5 for n in nodes(8)})
    assert len(window) == WINDOW_S / SAMPLE_S


def test_a_sample_older_than_the_latest_is_refused():
    window = Window()
    window.add(sample(10.0, {"a": 0.1}))
    with pytest.raises(ValueError):
        window.add(sample(5.0, {"a": 0.1}))


def test_a_gap_in_a_nodes_samples_breaks_its_idle_run():
    window = Window()
    feed(window, 0.0, 40.0, lambda t: {"c-0": 0.5, "c-1": 0.0})
    feed(window, 80.0, 150.0, lambda t: {"c-0": 0.5, "c-1": 0.0})   # 45 s unseen: idle again only from 80 s
    assert not window.idle_whole_window("c-1", 145.0)
    feed(window, 150.0, 160.0, lambda t: {"c-0": 0.5, "c-1": 0.0})
    assert window.idle_whole_window("c-1", 155.0)


# --- Scale out -----------------------------------------------------------------------------------------------

def run_until_change(pol, window, state, utils, start, end, tick_phase=0.0):
    """Feed samples every 5 s and decide every 15 s (first tick at ``start + tick_phase``); return the first
    (time, decision) that is not a Hold, and the first sample time at which the window mean went over target."""
    crossed = None
    t = start
    next_tick = start + tick_phase
    while t < end:
        window.add(sample(t, utils(t)))
        mean = window.mean_util(t)
        if crossed is None and mean is not None and mean > pol.target_gpu_util:
            crossed = t
        if t >= next_tick:
            decision = decide(pol, window, state, t)
            if not isinstance(decision, Hold):
                return t, decision, crossed
            next_tick += TICK_S
        t += SAMPLE_S
    return None, None, crossed


@pytest.mark.parametrize("tick_phase", [0.0, 5.0, 10.0])
@pytest.mark.parametrize(("high", "low"), [(0.8, 0.65), (0.9, 0.6), (1.0, 0.6)])
def test_the_window_mean_scales_out_within_20_s_of_crossing_the_target(tick_phase, high, low):
    # Every other sample under the target: no surge, only the mean (0.725–0.80) says the cluster is too busy.
    pol = policy()
    window = Window()
    state = ClusterState(nodes=nodes(2))
    feed(window, 0.0, 300.0, lambda t: {"c-0": 0.5, "c-1": 0.5})

    def alternating(t: float) -> dict[str, float]:
        return dict.fromkeys(("c-0", "c-1"), high if (t // SAMPLE_S) % 2 == 0 else low)
    at, decision, crossed = run_until_change(pol, window, state, alternating, 300.0, 600.0, tick_phase)
    assert isinstance(decision, ScaleOut) and decision.count == 1
    assert decision.reason.startswith("window utilisation")
    assert crossed is not None and at - crossed <= 20.0
    # The window's mean lags a change in raw utilisation by the share of the window the change must fill.
    mean = (high + low) / 2
    assert at - 300.0 <= (pol.target_gpu_util - 0.5) / (mean - 0.5) * WINDOW_S + TICK_S + SAMPLE_S


def test_pending_jobs_scale_out_at_the_next_tick_even_in_the_cool_down():
    window = Window()
    feed(window, 0.0, 100.0, lambda t: {"c-0": 0.2})
    state = ClusterState(nodes=nodes(1), pending_jobs=3, last_change_at=90.0)
    assert decide(policy(scale_out_step=2), window, state, 100.0) == ScaleOut(2, "3 job(s) pending")


def test_scale_out_never_passes_the_maximum():
    window = Window()
    feed(window, 0.0, 100.0, lambda t: {n: 1.0 for n in nodes(3)})
    pol = policy(max_nodes=4, scale_out_step=3)
    assert decide(pol, window, ClusterState(nodes=nodes(3)), 95.0).count == 1
    assert isinstance(decide(pol, window, ClusterState(nodes=nodes(4)), 95.0), Hold)
    assert isinstance(decide(pol, window, ClusterState(nodes=nodes(4), pending_jobs=5), 95.0), Hold)


def test_under_the_minimum_it_scales_out_to_the_minimum():
    window = Window()
    assert decide(policy(min_nodes=3), window, ClusterState(nodes=nodes(1)), 0.0).count == 2


def test_the_cool_down_holds_a_utilisation_scale_out():
    window = Window()
    feed(window, 0.0, 100.0, lambda t: {n: 1.0 for n in nodes(2)})
    pol = policy(cooldown_s=300.0)
    assert isinstance(decide(pol, window, ClusterState(nodes=nodes(2), last_change_at=0.0), 95.0), Hold)
    window2 = Window()
    feed(window2, 250.0, 305.0, lambda t: {n: 1.0 for n in nodes(2)})
    assert isinstance(decide(pol, window2, ClusterState(nodes=nodes(2), last_change_at=0.0), 300.0), ScaleOut)


def test_stale_samples_hold_a_utilisation_decision():
    window = Window()
    feed(window, 0.0, 100.0, lambda t: {n: 1.0 for n in nodes(2)})
    assert decide(policy(), window, ClusterState(nodes=nodes(2)), 130.0) == Hold("no recent GPU sample")


@pytest.mark.parametrize("field", ["joining", "draining"])
def test_a_change_in_flight_blocks_every_other(field):
    window = Window()
    feed(window, 0.0, 100.0, lambda t: {n: 1.0 for n in nodes(3)})
    state = ClusterState(nodes=nodes(3), pending_jobs=4, **{field: frozenset({"c-2"})})
    assert isinstance(decide(policy(), window, state, 95.0), Hold)


# --- Scale in ------------------------------------------------------------------------------------------------

def test_scale_in_waits_for_a_whole_idle_window_and_takes_the_newest_first():
    pol = policy(min_nodes=1, scale_in_step=2)
    window = Window()
    utils = {"c-0": 0.3, "c-1": 0.0, "c-2": 0.0, "c-3": 0.0}
    feed(window, 0.0, 70.0, lambda t: utils)
    assert isinstance(decide(pol, window, ClusterState(nodes=nodes(4)), 65.0), Hold)   # idle for 65 s only
    feed(window, 70.0, 75.0, lambda t: utils)
    assert decide(pol, window, ClusterState(nodes=nodes(4)), 70.0).nodes == ("c-3", "c-2")


def test_scale_in_never_takes_the_controller_nor_goes_under_the_minimum():
    window = Window()
    feed(window, 0.0, 200.0, lambda t: {n: 0.0 for n in nodes(3)})
    assert decide(policy(min_nodes=2, scale_in_step=5), window, ClusterState(nodes=nodes(3)), 195.0).nodes == ("c-2",)
    chosen = decide(policy(min_nodes=1, scale_in_step=5), window, ClusterState(nodes=nodes(3)), 195.0).nodes
    assert chosen == ("c-2", "c-1")
    assert isinstance(decide(policy(min_nodes=1), window, ClusterState(nodes=nodes(1)), 195.0), Hold)


def test_a_node_running_a_job_at_zero_utilisation_is_not_idle():
    window = Window()
    t = 0.0
    while t < 200.0:
        window.add(sample(t, {"c-0": 0.0, "c-1": 0.0}, jobs={"c-1": 1}))
        t += SAMPLE_S
    assert isinstance(decide(policy(), window, ClusterState(nodes=nodes(2)), 195.0), Hold)


def test_over_the_maximum_it_drains_the_newest():
    window = Window()
    decision = decide(policy(max_nodes=2), window, ClusterState(nodes=nodes(4)), 0.0)
    assert decision.nodes == ("c-3", "c-2")


# --- No flapping ---------------------------------------------------------------------------------------------

def simulate(pol: ScalingPolicy, load: float, seconds: float, size: int = 3, seed: int = 7) -> list[tuple]:
    """A closed loop: ``load`` GPUs of work (±0.03 noise) packed onto 1-GPU nodes in order; every decision is
    applied at once. Returns the changes made."""
    rng = random.Random(seed)
    names = list(nodes(size))
    window = Window()
    changes: list[tuple] = []
    last = None
    t = 0.0
    while t < seconds:
        work = load + rng.uniform(-0.03, 0.03)
        window.add(sample(t, {n: min(1.0, max(0.0, work - i)) for i, n in enumerate(names)}))
        if t % TICK_S == 0:
            decision = decide(pol, window, ClusterState(nodes=tuple(names), last_change_at=last), t)
            if isinstance(decision, ScaleOut):
                names += [f"c-{len(names) + k}" for k in range(decision.count)]
            elif isinstance(decision, ScaleIn):
                names = [n for n in names if n not in decision.nodes]
            if not isinstance(decision, Hold):
                changes.append((t, decision))
                last = t
        t += SAMPLE_S
    return changes


def test_a_load_at_the_target_settles_without_flapping():
    # 1.4 GPUs of work: on 2 nodes that is 0.70, the target. The band (0.1) keeps the third node.
    changes = simulate(policy(min_nodes=1, hysteresis=0.1), load=1.4, seconds=3 * 3600)
    assert changes == []


def test_without_the_band_the_same_load_flaps():
    changes = simulate(policy(min_nodes=1, hysteresis=0.0), load=1.4, seconds=3 * 3600)
    assert len(changes) >= 4
    kinds = {type(d) for _, d in changes}
    assert kinds == {ScaleIn, ScaleOut}


def test_changes_are_at_least_a_cool_down_apart():
    changes = simulate(policy(min_nodes=1, hysteresis=0.0, cooldown_s=300.0), load=1.4, seconds=3 * 3600)
    gaps = [b - a for (a, _), (b, _) in zip(changes, changes[1:])]
    assert gaps and min(gaps) >= 300.0


# --- Policy --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    {"min_nodes": 0}, {"max_nodes": 0, "min_nodes": 1}, {"target_gpu_util": 0.0}, {"target_gpu_util": 1.5},
    {"cooldown_s": -1}, {"scale_out_step": 0}, {"scale_in_step": 0}, {"hysteresis": 0.7},
])
def test_a_policy_out_of_its_bounds_is_refused(bad):
    with pytest.raises(ValueError):
        policy(**bad)


class _Msg:
    def __init__(self, data: bytes, subject: str = "node_agent.evt.heartbeat.n") -> None:
        self.data, self.subject = data, subject


async def test_a_heartbeat_as_the_bus_delivers_it_feeds_each_allocations_gpu_utilisation():
    """The listener gets the core NATS message itself (an envelope's bytes), not a parsed model."""
    alloc = uuid.uuid4()
    scaler = Autoscaler(None, {}, source="metrics", tick_s=15, window_s=70, clock=lambda: 100.0)
    beat = {"node_id": str(uuid.uuid4()), "seq": 1, "sent_at": "2026-11-29T00:00:00Z",
            "started_at": "2026-11-29T00:00:00Z",
            "gpus": [{"gpu": 0, "allocation_id": str(alloc), "util_pct": 87.5, "fb_used_mib": 1, "temp_c": 40,
                      "power_w": 100}, {"gpu": 1, "util_pct": 5, "fb_used_mib": 1, "temp_c": 40, "power_w": 100}]}
    await scaler.on_heartbeat(_Msg(make_envelope("node_agent.heartbeat", beat).model_dump_json().encode()))
    assert scaler.gpu_util == {alloc: {0: (100.0, 0.875)}}
    await scaler.on_heartbeat(_Msg(b"not json"))            # dropped, logged
    assert scaler.gpu_util == {alloc: {0: (100.0, 0.875)}}


async def test_the_utilisation_of_allocations_no_heartbeat_tells_of_any_more_is_forgotten():
    """Every allocation of the fleet passes through the listener: one released (no heartbeat names it again) is
    forgotten once its samples are older than they stay fresh, and a GPU it no longer has with it."""
    now = [100.0]
    scaler = Autoscaler(None, {}, source="metrics", tick_s=15, window_s=70, clock=lambda: now[0])
    gone, kept = uuid.uuid4(), uuid.uuid4()

    def beat(*gpus: tuple[int, uuid.UUID]) -> _Msg:
        body = {"node_id": str(uuid.uuid4()), "seq": 1, "sent_at": "2026-11-29T00:00:00Z",
                "started_at": "2026-11-29T00:00:00Z",
                "gpus": [{"gpu": g, "allocation_id": str(a), "util_pct": 50, "fb_used_mib": 1, "temp_c": 40,
                          "power_w": 100} for g, a in gpus]}
        return _Msg(make_envelope("node_agent.heartbeat", body).model_dump_json().encode())

    await scaler.on_heartbeat(beat((0, gone), (1, kept), (2, kept)))
    now[0] += 20
    await scaler.on_heartbeat(beat((1, kept)))          # within the TTL of the first: nothing forgotten yet
    assert set(scaler.gpu_util) == {gone, kept}
    now[0] += 15                                         # 35 s after the first beat, 15 s after the second
    await scaler.on_heartbeat(beat((1, kept)))
    assert scaler.gpu_util == {kept: {1: (now[0], 0.5)}}
