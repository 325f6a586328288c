"""An allocation's sagas as a timeline (domain.timeline): records in the order the saga runs them, each undo
after its step, with durations."""
from __future__ import annotations

from datetime import timedelta

from services.saga.domain.definitions import ALLOCATE, RELEASE
from services.saga.domain.timeline import duration_s, ordered, saga_steps
from tests.support.saga import T0


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def test_the_timeline_orders_records_as_the_saga_runs_them_each_undo_after_its_step():
    records = [{"step": n, "phase": p} for n in reversed(ALLOCATE.names) for p in ("compensate", "invoke")]
    records.append({"step": "retired_step", "phase": "invoke"})
    got = [(r["step"], r["phase"]) for r in ordered("allocate", records)]
    assert got[:4] == [("reserve_slots", "invoke"), ("reserve_slots", "compensate"),
                       ("attach_network", "invoke"), ("attach_network", "compensate")]
    assert got[-1] == ("retired_step", "invoke")
    assert [r["step"] for r in ordered("release", [{"step": n, "phase": "invoke"} for n in
                                                   reversed(RELEASE.names)])] == RELEASE.names


def test_durations_are_null_while_running():
    assert duration_s(at(0), at(1.25)) == 1.25
    assert duration_s(at(0), None) is None and duration_s(None, None) is None
    saga = {"saga_id": "s", "kind": "release", "state": "running", "started_at": at(0), "finished_at": None}
    doc = saga_steps(saga, [{"step": "stop_meter", "phase": "invoke", "status": "invoked", "attempt": 1,
                             "started_at": at(0), "finished_at": None, "error": None}])
    assert doc["steps"][0]["duration_s"] is None and doc["state"] == "running"
