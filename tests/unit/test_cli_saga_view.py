"""The non-terminal view of a saga: one line per completed step, once; the queue position when it changes;
undos that never ran left out."""
from __future__ import annotations

from cli.saga_view import LineView, flatten

SAGA = {"saga_id": "s1", "kind": "allocate", "state": "running", "started_at": "2026-11-29T00:00:00Z", "steps": [
    {"step": "reserve_slots", "phase": "invoke", "status": "succeeded", "attempt": 1, "duration_s": 0.012},
    {"step": "reserve_slots", "phase": "compensate", "status": "armed", "attempt": 0, "duration_s": None},
    {"step": "attach_network", "phase": "invoke", "status": "invoked", "attempt": 1, "duration_s": None}]}


def test_flatten_leaves_out_undos_never_needed():
    assert [(s["step"], s["phase"]) for s in flatten([SAGA])] == [("reserve_slots", "invoke"),
                                                                   ("attach_network", "invoke")]


def test_lines_for_state_queue_and_completed_steps_each_once(capsys):
    view = LineView("a1")
    queued = {"id": "a1", "state": "QUEUED", "queue_position": 3, "queued_reason": "no capacity"}
    view.update(queued, [])
    view.update(queued, [])
    view.update({**queued, "queue_position": 2}, [])
    running = {"id": "a1", "state": "PROVISIONING", "queue_position": None}
    view.update(running, flatten([SAGA]))
    view.update(running, flatten([SAGA]))
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == ["state QUEUED", "queued: position 3 (no capacity)", "queued: position 2 (no capacity)"]
    # the steps a read finds ended come before the state they led to
    assert [ln.split()[:3] for ln in lines[3:4]] == [["step", "reserve_slots", "succeeded"]]
    assert lines[3].endswith("0.012s")
    assert lines[4:] == ["state PROVISIONING"]
