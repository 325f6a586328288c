"""Node health rules: liveness, state changes, classification by the policy, and the cordon breaker."""
from datetime import UTC, datetime, timedelta

from services.scheduler.domain import health as h

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def test_a_silent_node_is_suspect_after_one_timeout_and_unreachable_after_two():
    assert h.liveness(T0, T0 + timedelta(seconds=4.9), 5) == h.HEALTHY
    assert h.liveness(T0, T0 + timedelta(seconds=5), 5) == h.SUSPECT
    assert h.liveness(T0, T0 + timedelta(seconds=10), 5) == h.UNREACHABLE


def test_an_unreachable_node_that_answers_is_healthy_only_once_it_holds_nothing_placed_elsewhere():
    assert h.next_state(h.UNREACHABLE, h.SUSPECT, False) == h.UNREACHABLE
    assert h.next_state(h.UNREACHABLE, h.HEALTHY, True) == h.RECONCILING
    assert h.next_state(h.RECONCILING, h.HEALTHY, True) == h.RECONCILING
    assert h.next_state(h.RECONCILING, h.HEALTHY, False) == h.HEALTHY
    assert h.next_state(h.HEALTHY, h.SUSPECT, False) == h.SUSPECT


def test_xids_are_classified_by_nvidia_buckets_and_an_unnamed_xid_prevents_allocations():
    policy = {k: v[0] for k, v in h.DEFAULT_POLICY.items()}
    assert h.classify("xid:79", policy) == (h.DRAIN, h.FENCE, h.REPLACE)
    assert h.classify("xid:48", policy) == (h.DRAIN, h.RESET_GPU)
    assert h.classify("xid:63", policy) == ()          # catalog: no action
    assert h.classify("xid:94", policy) == ()          # catalog: restart the application
    assert h.classify("xid:13", policy) == ()          # an application error
    assert h.classify("xid:999", policy) == (h.PREVENT,)
    assert h.classify("something_new", policy) == ()
    assert h.classify(h.HEARTBEAT_LOST, policy) == (h.DRAIN, h.FENCE)


def test_the_provider_policy_overrides_the_default():
    assert h.classify("xid:63", {"xid:63": (h.PREVENT,)}) == (h.PREVENT,)


def test_the_breaker_opens_once_half_the_pool_was_cordoned_in_the_window_and_stays_open():
    b = h.Breaker("shared", share=0.5, window_s=300)
    assert b.allows(T0, 4)
    b.record(T0)
    assert b.allows(T0 + timedelta(seconds=1), 4)
    b.record(T0 + timedelta(seconds=1))
    assert not b.allows(T0 + timedelta(seconds=2), 4) and b.open
    assert not b.allows(T0 + timedelta(seconds=1000), 4)      # only a provider admin closes it
    b.close()
    assert b.allows(T0 + timedelta(seconds=1000), 4)


def test_cordons_outside_the_window_do_not_count():
    b = h.Breaker("shared", share=0.5, window_s=300)
    b.record(T0)
    b.record(T0 + timedelta(seconds=1))
    assert b.allows(T0 + timedelta(seconds=302), 4)


def test_a_one_node_pool_is_never_held_back():
    b = h.Breaker("solo")
    assert b.allows(T0, 1)
    b.record(T0)
    assert b.allows(T0, 1)


def test_a_lost_heartbeat_interrupts_as_node_lost_and_a_gpu_fault_as_gpu_fault():
    assert h.category(h.HEARTBEAT_LOST) == "node_lost"
    assert h.category("xid:79") == "gpu_fault"
