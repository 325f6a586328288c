"""The Allocation aggregate's state machine (pure domain, no I/O)."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from services.allocation.domain import events
from services.allocation.domain.errors import IllegalTransition, InvalidSpec
from services.allocation.domain.model import ACTIVE, FAILED, RELEASED, RELEASING, REQUESTED, Allocation

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def requested(**overrides) -> Allocation:
    spec = dict(id=uuid.uuid4(), tenant_id=uuid.uuid4(), user_id=uuid.uuid4(), name="train-1", shape="vm.2gpu",
                gpu_count=2, volume_gb=100, labels={"team": "ml"}, at=T0)
    spec.update(overrides)
    return Allocation.request(**spec)


def in_state(state: str) -> Allocation:
    a = requested()
    steps = {
        REQUESTED: [],
        ACTIVE: [lambda: a.activate(uuid.uuid4(), at(2))],
        RELEASING: [lambda: a.activate(uuid.uuid4(), at(2)), lambda: a.release(uuid.uuid4(), at(3))],
        RELEASED: [lambda: a.activate(uuid.uuid4(), at(2)), lambda: a.release(uuid.uuid4(), at(3)),
                   lambda: a.mark_released(at(4))],
        FAILED: [lambda: a.fail("reserve_slots", "no capacity", at(1))],
    }[state]
    for step in steps:
        step()
    a.pull_events()
    assert a.state == state
    return a


def test_request_records_requested_with_the_full_spec():
    a = requested()
    [ev] = a.pull_events()
    assert isinstance(ev, events.Requested)
    assert (ev.state, ev.at, ev.shape, ev.gpu_count) == (REQUESTED, T0, "vm.2gpu", 2)
    assert (ev.volume_gb, ev.labels, ev.user_id, ev.name) == (100, {"team": "ml"}, a.user_id, "train-1")
    assert a.pull_events() == []


@pytest.mark.parametrize("shape,gpus", [("vm.17gpu", 17), ("vm.2gpu", 4), ("", 1), ("vm.0gpu", 0)])
def test_request_with_an_impossible_gpu_count_or_a_builtin_shape_mismatch_is_invalid(shape, gpus):
    with pytest.raises(InvalidSpec):
        requested(shape=shape, gpu_count=gpus)


def test_a_provider_defined_shape_unknown_here_is_accepted_the_scheduler_decides():
    a = requested(shape="mig.1g.10gb", gpu_count=1)
    assert a.state == REQUESTED


def test_preempting_an_active_allocation_releases_it_with_the_reason():
    a = requested()
    a.activate(uuid.uuid4(), T0)
    a.pull_events()
    assert a.preempt("preempted: for a priority-100 request", T0) is True
    [ev] = a.pull_events()
    assert isinstance(ev, events.ReleaseRequested)
    assert (a.state, ev.reason, ev.requested_by) == (RELEASING, "preempted: for a priority-100 request", None)
    assert a.preempt("again", T0) is False and a.pull_events() == []


def test_preempting_before_the_allocation_is_active_is_an_illegal_transition():
    with pytest.raises(IllegalTransition):
        requested().preempt("too early", T0)


def test_happy_path_walks_the_whole_life_cycle_recording_one_event_per_transition():
    a, node, user = requested(), uuid.uuid4(), uuid.uuid4()
    a.activate(node, at(2))
    a.release(user, at(3))
    a.mark_released(at(4))
    kinds = [type(e) for e in a.pull_events()]
    assert kinds == [events.Requested, events.Activated, events.ReleaseRequested, events.Released]
    assert (a.state, a.node_id, a.updated_at) == (RELEASED, node, at(4))


def test_release_requested_carries_what_the_release_saga_needs():
    a = in_state(ACTIVE)
    a.release(uuid.uuid4(), at(5))
    [ev] = a.pull_events()
    assert (ev.node_id, ev.volume_gb, ev.labels, ev.state) == (a.node_id, 100, {"team": "ml"}, RELEASING)


@pytest.mark.parametrize("state", [FAILED, RELEASING, RELEASED])
def test_activate_from_a_later_or_terminal_state_is_illegal_and_changes_nothing(state):
    a = in_state(state)
    with pytest.raises(IllegalTransition) as err:
        a.activate(uuid.uuid4(), at(9))
    assert state in str(err.value)
    assert a.state == state and a.pull_events() == []


def test_activate_twice_on_the_same_node_is_a_no_op_but_another_node_is_illegal():
    a, node = requested(), uuid.uuid4()
    a.activate(node, at(1))
    a.pull_events()
    a.activate(node, at(2))
    assert a.pull_events() == []
    with pytest.raises(IllegalTransition):
        a.activate(uuid.uuid4(), at(3))
    assert a.node_id == node


@pytest.mark.parametrize("state", [REQUESTED, ACTIVE, RELEASING])
def test_fail_from_any_live_state_records_step_and_reason(state):
    a = in_state(state)
    a.fail("attach_network", "pool exhausted", at(9))
    [ev] = a.pull_events()
    assert isinstance(ev, events.Failed)
    assert (a.state, a.failed_step, a.reason) == (FAILED, "attach_network", "pool exhausted")
    assert (ev.failed_step, ev.reason) == ("attach_network", "pool exhausted")


def test_fail_when_already_failed_keeps_the_first_reason():
    a = in_state(FAILED)
    a.fail("other", "later reason", at(9))
    assert (a.failed_step, a.reason) == ("reserve_slots", "no capacity") and a.pull_events() == []


def test_fail_after_released_is_illegal():
    a = in_state(RELEASED)
    with pytest.raises(IllegalTransition):
        a.fail("x", "y", at(9))


def test_a_requested_allocation_withdrawn_before_it_started_is_released_without_a_node():
    a = in_state(REQUESTED)
    a.release(uuid.uuid4(), at(9), withdrawn=True)
    [ev] = a.pull_events()
    assert (a.state, ev.state, ev.node_id) == (RELEASING, RELEASING, None)
    a.mark_released(at(10))
    assert a.state == RELEASED


@pytest.mark.parametrize("state", [REQUESTED, FAILED])
def test_a_release_but_a_withdrawal_while_requested_and_any_once_failed_is_illegal(state):
    """REQUESTED lasts while its allocate saga runs: a release then could race with the saga."""
    a = in_state(state)
    with pytest.raises(IllegalTransition) as err:
        a.release(uuid.uuid4(), at(9))
    assert err.value.current == state and err.value.target == RELEASING
    assert a.state == state


@pytest.mark.parametrize("state", [RELEASING, RELEASED])
def test_release_when_already_releasing_or_released_is_a_no_op(state):
    a = in_state(state)
    a.release(uuid.uuid4(), at(9))
    assert a.state == state and a.pull_events() == []


@pytest.mark.parametrize("state", [REQUESTED, ACTIVE, FAILED])
def test_mark_released_only_follows_releasing(state):
    a = in_state(state)
    with pytest.raises(IllegalTransition):
        a.mark_released(at(9))


def test_mark_released_twice_is_a_no_op():
    a = in_state(RELEASED)
    a.mark_released(at(9))
    assert a.state == RELEASED and a.pull_events() == []


def test_updated_at_never_moves_backwards():
    a = requested(at=at(10))
    a.activate(uuid.uuid4(), at(5))
    assert a.updated_at == at(10)
