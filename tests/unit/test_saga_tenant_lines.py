"""Each tenant's line of allocate sagas (services/saga/domain/lines.py) and its setting: pure rules, no I/O."""
from __future__ import annotations

import dataclasses
import uuid

import pytest

from services.saga.domain import lines
from services.saga.domain.definitions import RELEASE
from services.saga.domain.lines import PLACES_TOLD, Line, admits, leaves_flight, places, retell, room, withdrawal
from services.saga.domain.machine import handle
from services.saga.domain.model import Policy, Saga, Start
from services.saga.settings import SagaSettings
from shared.envelope import utcnow


def saga(kind: str = "allocate", status: str = "running") -> Saga:
    return Saga(uuid.uuid4(), kind, uuid.uuid4(), uuid.uuid4(), {}, status=status)


def test_a_request_starts_at_once_while_its_tenant_is_under_the_bound_and_no_one_waits():
    assert admits(Line(in_flight=0, waiting=False), bound=2)
    assert admits(Line(in_flight=1, waiting=False), bound=2)


def test_a_request_waits_when_its_tenant_is_at_the_bound():
    assert not admits(Line(in_flight=2, waiting=False), bound=2)
    assert not admits(Line(in_flight=5, waiting=False), bound=2)      # the bound was lowered


def test_a_request_never_overtakes_an_earlier_request_of_its_tenant_that_waits():
    assert not admits(Line(in_flight=0, waiting=True), bound=2)


def test_room_is_what_the_bound_leaves_and_never_negative():
    assert [room(n, 3) for n in (0, 1, 3, 7)] == [3, 2, 0, 0]


@pytest.mark.parametrize("ending", ["completed", "failed"])
def test_an_allocate_saga_that_ends_leaves_its_place_in_the_line(ending):
    before = saga(status="running")
    assert leaves_flight(before, dataclasses.replace(before, status=ending))
    compensating = saga(status="compensating")
    assert leaves_flight(compensating, dataclasses.replace(compensating, status=ending))


def test_a_saga_still_in_flight_or_a_release_saga_frees_no_place():
    running = saga()
    assert not leaves_flight(running, dataclasses.replace(running, status="compensating"))
    assert not leaves_flight(running, running)
    release = saga("release")
    assert not leaves_flight(release, dataclasses.replace(release, status="completed"))
    done = saga(status="completed")
    assert not leaves_flight(done, done)          # a late input for an ended saga frees nothing twice


def test_the_bound_defaults_to_8_and_is_read_from_its_variable():
    assert SagaSettings.from_env({}).policy.tenant_inflight == 8
    assert SagaSettings.from_env({"TESSERA_SAGA_TENANT_INFLIGHT": "2"}).policy.tenant_inflight == 2


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_an_unusable_bound_is_refused_naming_the_variable(value):
    with pytest.raises(ValueError, match="saga settings: TESSERA_SAGA_TENANT_INFLIGHT="):
        SagaSettings.from_env({"TESSERA_SAGA_TENANT_INFLIGHT": value})


def test_a_policy_without_room_for_one_saga_is_refused():
    with pytest.raises(ValueError):
        Policy(tenant_inflight=0)


# --- places in line ------------------------------------------------------------------------------------------

def test_a_request_joining_is_told_its_place_counted_from_1():
    assert places([("a", 1), ("b", 2), ("c", None)]) == [("c", 3)]


def test_when_the_line_moves_each_request_near_the_front_is_told_its_new_place():
    # a left the front: b and c each moved up one
    assert places([("b", 2), ("c", 3)]) == [("b", 1), ("c", 2)]
    assert places([("b", 1), ("c", 2)]) == []                        # nothing moved: nothing told


def test_a_place_is_only_ever_told_lower():
    assert not retell(3, 2) and not retell(2, 2)


def test_far_back_a_request_is_told_only_when_its_place_halved():
    far = PLACES_TOLD * 4
    assert not retell(far - 1, far)
    assert not retell(far // 2 + 1, far) and retell(far // 2, far)
    assert retell(PLACES_TOLD, PLACES_TOLD + 1)                      # back within the first places: every change


def test_draining_a_long_line_tells_each_request_a_bounded_number_of_times():
    n = 1000
    line = [(k, None) for k in range(n)]
    told = dict(places(line))
    messages = len(told)
    while line:
        line = [(k, told.get(k, t)) for k, t in line[1:]]          # the front one starts
        now = dict(places(line))
        messages += len(now)
        told.update(now)
    assert messages < n * (PLACES_TOLD + 12)                         # O(n * PLACES_TOLD), never n²/2
    assert messages < n * n // 4


# --- a release before the allocate saga started ----------------------------------------------------------------

def test_a_waiting_allocation_is_released_from_the_line():
    assert withdrawal(in_line=True, allocate_status=None) == lines.FROM_LINE


@pytest.mark.parametrize("status, decision", [(None, lines.EARLY), ("running", lines.AFTER_START),
                                              ("compensating", lines.AFTER_START), ("completed", lines.NOW),
                                              ("failed", lines.NOTHING)])
def test_one_not_in_line_is_released_once_its_saga_lets_it(status, decision):
    assert withdrawal(in_line=False, allocate_status=status) == decision


def test_the_release_saga_of_a_withdrawn_allocation_only_marks_it_released():
    s = Saga(uuid.uuid4(), "release", uuid.uuid4(), uuid.uuid4(), {"withdrawn": True, "node_id": None, "labels": {}})
    after, actions, changes = handle(s, Start(utcnow()), Policy())
    assert [a.type for a in actions if a.type.startswith(("allocation.", "scheduler.", "billing.", "storage.",
                                                          "network.", "node_agent."))] == ["allocation.mark_released"]
    assert [c.step for c in changes if c.status == "succeeded"] == RELEASE.names[:-1]
    assert after.current_step == "mark_released"
