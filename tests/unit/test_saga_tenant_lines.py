"""Each tenant's line of allocate sagas (services/saga/domain/lines.py) and its setting: pure rules, no I/O."""
from __future__ import annotations

import dataclasses
import uuid

import pytest

from services.saga.domain.lines import Line, admits, leaves_flight, room
from services.saga.domain.model import Policy, Saga
from services.saga.settings import SagaSettings


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
