"""The gateway's pure rules: forward-only states, roles, keys, cursors and subject filters."""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest

from services.gateway.api.ops.routes import subscription_plan
from services.gateway.api.ops.rules import intersect, valid_filter
from services.gateway.domain.keys import BadCursor, decode_cursor, encode_cursor, fingerprint, hash_api_key, new_api_key
from services.gateway.domain.model import Principal, advances, advancing_from, interruption_moves

ORDER = ["REQUESTED", "PROVISIONING", "ACTIVE", "RELEASING", "RELEASED"]


@pytest.mark.parametrize("i", range(len(ORDER)))
def test_states_only_move_forward(i):
    current = ORDER[i]
    for j, new in enumerate(ORDER):
        assert advances(current, new) == (j > i and current != "RELEASED"), (current, new)


def test_failed_wins_over_any_live_state_and_terminal_states_never_change():
    for s in ["REQUESTED", "PROVISIONING", "ACTIVE", "RELEASING"]:
        assert advances(s, "FAILED")
    for s in ORDER + ["FAILED"]:
        assert not advances("FAILED", s)
        assert not advances("RELEASED", s)
    assert not advances("ACTIVE", "PROVISIONING")


def test_the_guard_a_move_is_written_with_is_advances():
    every = ORDER + ["QUEUED", "INTERRUPTED", "FAILED"]
    for new in every:
        assert sorted(advancing_from(new)) == sorted(s for s in every if advances(s, new)), new
    assert advancing_from("ACTIVE") == ["REQUESTED", "PROVISIONING", "QUEUED"]


def test_an_interruption_moves_the_view_by_its_attempt_whatever_order_its_events_arrive_in():
    # attempt 1: interrupted, then rescheduled; either order leaves the view ACTIVE
    assert interruption_moves("ACTIVE", 0, False, 1, rescheduled=False)
    assert interruption_moves("INTERRUPTED", 1, False, 1, rescheduled=True)
    assert not interruption_moves("ACTIVE", 1, True, 1, rescheduled=False)   # late: its reschedule came first
    # a later attempt moves it again; an earlier one never does
    assert interruption_moves("ACTIVE", 1, True, 2, rescheduled=False)
    assert not interruption_moves("INTERRUPTED", 2, False, 1, rescheduled=True)
    # never from releasing or a terminal state; INTERRUPTED ranks with ACTIVE for the other events
    for state in ("RELEASING", "RELEASED", "FAILED"):
        assert not interruption_moves(state, 0, False, 1, rescheduled=False)
    assert advances("INTERRUPTED", "FAILED") and advances("INTERRUPTED", "RELEASING")
    assert not advances("INTERRUPTED", "ACTIVE") and not advances("ACTIVE", "INTERRUPTED")


def test_principal_permissions_follow_role_and_tenant():
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    admin = Principal(uuid.uuid4(), None, "provider_admin")
    tadmin = Principal(uuid.uuid4(), t1, "tenant_admin")
    user = Principal(uuid.uuid4(), t1, "tenant_user")
    assert admin.may_manage_users_of(t1) and admin.may_manage_users_of(t2) and not admin.may_use_allocations
    assert tadmin.may_manage_users_of(t1) and not tadmin.may_manage_users_of(t2) and tadmin.may_use_allocations
    assert not user.may_manage_users_of(t1) and user.may_use_allocations


def test_api_keys_are_random_prefixed_and_stored_as_sha256():
    a, b = new_api_key(), new_api_key()
    assert a.startswith("tsk_") and a != b and len(a) > 40
    assert hash_api_key(a) == hash_api_key(a) != hash_api_key(b)
    assert len(hash_api_key(a)) == 64 and a not in hash_api_key(a)


def test_fingerprint_ignores_key_order_but_not_values():
    assert fingerprint({"a": 1, "b": {"x": "1", "y": "2"}}) == fingerprint({"b": {"y": "2", "x": "1"}, "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_cursor_round_trips_and_rejects_anything_else():
    at = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    ident = uuid.uuid4()
    assert decode_cursor(encode_cursor(at, ident)) == (at, ident)
    for bad in ["garbage", "", "W10", encode_cursor(at, ident)[:-3] + "!!!", "WyIyMDMwLTAxLTAxIiwgIngiXQ"]:
        with pytest.raises(BadCursor):
            decode_cursor(bad)


@pytest.mark.parametrize("a,b,expected", [
    (">", "allocation.>", "allocation.>"),
    ("allocation.>", ">", "allocation.>"),
    ("*.evt.>", "allocation.>", "allocation.evt.>"),
    ("allocation.cmd.request", "allocation.>", "allocation.cmd.request"),
    ("saga.>", "allocation.>", None),
    ("a.>", "a", None),
    ("a.*", "a.>", "a.*"),
    ("a.*.c", "a.b.*", "a.b.c"),
    ("a.b", "a.b.c", None),
])
def test_subject_intersection(a, b, expected):
    assert intersect(a, b) == expected


def test_subject_filter_validation():
    for ok in (">", "allocation.>", "*.evt.*", "node_agent.cmd.provision.abc-1"):
        assert valid_filter(ok), ok
    for bad in ("", "a..b", "a.>.b", "a b", "a.>x", "."):
        assert not valid_filter(bad), bad


def test_ops_plan_maps_filters_onto_streams_without_nested_duplicates():
    assert subscription_plan(["allocation.>", "allocation.cmd.>"]) == [("TESSERA_ALLOCATION", "allocation.cmd.>"),
                                                                     ("TESSERA_ALLOCATION", "allocation.evt.>")]
    plan = subscription_plan(["*.evt.>"])
    assert ("TESSERA_SAGA", "saga.evt.>") in plan and all(f.split(".")[1] == "evt" for _, f in plan)
    assert ("TESSERA_DEADLETTER", "deadletter.>") in subscription_plan([">"])
    assert subscription_plan(["nothing.>"]) == []
