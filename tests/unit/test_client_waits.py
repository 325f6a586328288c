"""The client's allocation waits give up as soon as the awaited state cannot come any more (pure rules)."""
from __future__ import annotations

import pytest

from tooling.client import REACHABLE, unreachable


def alloc(state: str, **kw) -> dict:
    return {"id": "a1", "state": state, **kw}


def test_a_failed_allocation_cannot_become_active_and_the_reason_names_its_step_and_reason():
    why = unreachable(alloc("FAILED", failed_step="provision_node", reason="injected fault"), {"ACTIVE"})
    assert why == "allocation a1 FAILED at provision_node: injected fault"


@pytest.mark.parametrize("state, wanted", [
    ("RELEASED", {"ACTIVE"}), ("RELEASING", {"ACTIVE"}), ("ACTIVE", {"QUEUED"}), ("ACTIVE", {"REQUESTED", "PROVISIONING"}),
    ("FAILED", {"RELEASED"}),
])
def test_a_state_behind_the_allocation_or_after_a_terminal_one_is_given_up_on(state, wanted):
    assert unreachable(alloc(state), wanted)


@pytest.mark.parametrize("state, wanted", [
    ("REQUESTED", {"ACTIVE"}), ("QUEUED", {"ACTIVE"}), ("QUEUED", {"PROVISIONING"}), ("PROVISIONING", {"QUEUED"}),
    ("ACTIVE", {"RELEASED"}), ("RELEASING", {"RELEASED"}), ("PROVISIONING", {"FAILED"}),
    ("FAILED", {"FAILED", "ACTIVE"}), ("ACTIVE", {"ACTIVE"}), ("SUSPENDED", {"ACTIVE"}),   # a state it does not know
])
def test_while_the_awaited_state_can_still_come_the_wait_goes_on(state, wanted):
    assert unreachable(alloc(state), wanted) is None


def test_only_released_and_failed_are_terminal_and_failed_can_follow_every_other_state():
    assert {s for s, nxt in REACHABLE.items() if not nxt} == {"RELEASED", "FAILED"}
    assert all("FAILED" in nxt for s, nxt in REACHABLE.items() if nxt)
