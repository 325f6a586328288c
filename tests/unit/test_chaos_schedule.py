"""The chaos run's fault schedule comes from its seed alone: the same seed, the same faults; every service takes
its turn, and each kind of fault appears in a run long enough for a round."""
from __future__ import annotations

from tooling.chaos import SERVICES, schedule
from tooling.chaos_checks import dead_letter_violations, history_violations


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    assert schedule(42, 180, 3) == schedule(42, 180, 3)
    assert schedule(42, 180, 3) != schedule(43, 180, 3)


def test_faults_are_ordered_inside_the_run_and_every_service_takes_its_turn():
    faults = schedule(5, 180, 3)
    times = [f.at_s for f in faults]
    assert times == sorted(times) and times[0] >= 3 and times[-1] < 177
    service_faults = [f.target for f in faults if f.kind in ("kill", "pause")]
    assert service_faults[:len(SERVICES)] == list(SERVICES)


def test_a_round_holds_every_kind_of_fault_and_targets_exist():
    faults = schedule(9, 180, nodes=2, nats_servers=3)
    assert {f.kind for f in faults} >= {"node_agent_kill", "heartbeat_loss", "xid", "nats_kill", "pg_restart"}
    assert {f.kind for f in faults} & {"kill", "pause"}
    assert all(f.target in (0, 1) for f in faults if f.kind in ("node_agent_kill", "heartbeat_loss", "xid"))
    assert all(2.0 <= f.duration_s <= 5.0 for f in faults if f.kind == "pause")


def test_a_single_server_and_no_postgres_restart_leave_those_faults_out():
    kinds = {f.kind for f in schedule(3, 300, 3, nats_servers=1, postgres=False)}
    assert "nats_kill" not in kinds and "pg_restart" not in kinds


def test_an_allocation_activated_on_a_second_node_while_running_on_the_first_is_a_violation():
    a, n1, n2 = "a1", "node-1", "node-2"
    moved = [{"type": "allocation.activated", "data": {"allocation_id": a, "node_id": n1}},
             {"type": "allocation.interrupted", "data": {"allocation_id": a, "node_id": n1}},
             {"type": "allocation.rescheduled", "data": {"allocation_id": a, "from_node_id": n1, "to_node_id": n2}},
             {"type": "allocation.activated", "data": {"allocation_id": a, "node_id": n2}}]
    assert history_violations(moved) == []
    twice = [moved[0], {"type": "allocation.activated", "data": {"allocation_id": a, "node_id": n2}}]
    [v] = history_violations(twice)
    assert (v["allocation_id"], v["running_on"], v["activated_on"]) == (a, n1, n2)


def test_a_dead_letter_outside_every_fault_window_is_unexplained():
    faults = [{"kind": "kill", "target": "saga", "at_s": 10.0, "duration_s": 0.0}]
    inside = {"t": 30.0, "subject": "saga.evt.x", "reason": "max_deliver", "error": ""}
    outside = {"t": 5.0, "subject": "saga.evt.y", "reason": "invalid", "error": ""}
    [v] = dead_letter_violations([inside, outside], faults)
    assert v["subject"] == "saga.evt.y" and inside["explained_by"] == "kill saga at 10.0s"
