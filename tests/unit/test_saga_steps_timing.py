"""When each saga step ran: started when its command is first sent (kept across resends), finished at its
end (model.timed), as the state machine records it."""
from __future__ import annotations

from datetime import timedelta

from services.saga.domain.model import Policy, StepRecord, timed
from tests.support.saga import T0, SagaScenario


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


def test_a_command_sent_starts_the_record_and_an_end_finishes_it():
    assert timed(None, "invoked", at(0)) == (at(0), None)
    for end in ("succeeded", "failed", "timed_out", "compensated"):
        assert timed(StepRecord("invoked", 1, started_at=at(0)), end, at(2)) == (at(0), at(2))


def test_a_resend_keeps_the_first_start_and_a_record_sent_again_is_not_finished():
    retrying = StepRecord("retrying", 1, started_at=at(0))
    assert timed(StepRecord("invoked", 1, started_at=at(0)), "retrying", at(30)) == (at(0), None)
    assert timed(retrying, "invoked", at(31)) == (at(0), None)
    assert timed(StepRecord("succeeded", 1, started_at=at(0), finished_at=at(5)), "invoked", at(9)) == (at(0), None)
    assert timed(StepRecord("invoked", 1, started_at=at(0)), "waiting", at(1)) == (at(0), None)


def test_a_skipped_step_starts_and_finishes_at_once():
    assert timed(None, "succeeded", at(3)) == (at(3), at(3))


def test_an_allocate_saga_times_every_step_and_finishes_with_its_last():
    s = SagaScenario.allocate()
    cmd = s.expect_command("scheduler.reserve_slots")
    s.now = at(2)
    s.succeed(cmd, node_id="n", slots=[1], gpu_model="H100")
    reserve = s.saga.record("reserve_slots")
    assert (reserve.started_at, reserve.finished_at, reserve.attempt) == (at(0), at(2), 1)
    attach = s.saga.record("attach_network")
    assert (attach.started_at, attach.finished_at) == (at(2), None)
    assert s.saga.record("reserve_slots", "compensate").started_at is None   # armed: never ran
    assert s.saga.finished_at is None


def test_a_failed_step_finishes_and_its_compensations_are_timed_in_their_own_rows():
    s = SagaScenario.allocate()
    s.succeed(s.expect_command("scheduler.reserve_slots"), node_id="n", slots=[1], gpu_model="H100")
    s.now = at(1)
    s.fail(s.expect_command("network.attach_network"), "no address left")
    failed = s.saga.record("attach_network")
    assert (failed.status, failed.started_at, failed.finished_at, failed.error) == (
        "failed", at(0), at(1), "no address left")
    assert s.saga.record("attach_network", "compensate").status == "disarmed"
    undo = s.saga.record("reserve_slots", "compensate")
    assert (undo.status, undo.started_at, undo.finished_at) == ("compensating", at(1), None)
    s.now = at(4)
    s.undone(s.expect_command("scheduler.release_slots"))
    undo = s.saga.record("reserve_slots", "compensate")
    assert (undo.status, undo.started_at, undo.finished_at) == ("compensated", at(1), at(4))
    assert s.saga.status == "failed" and s.saga.finished_at == at(4)
    assert s.saga.record("reserve_slots").finished_at == at(0)   # the step itself keeps its own end


def test_a_timed_out_step_finishes_when_it_times_out():
    s = SagaScenario.allocate(Policy(step_timeout_s=30))
    s.expect_command("scheduler.reserve_slots")
    s.advance(30)
    rec = s.saga.record("reserve_slots")
    assert (rec.status, rec.started_at, rec.finished_at) == ("timed_out", at(0), at(30))


def test_a_resent_release_step_keeps_its_first_start_and_counts_its_attempts():
    s = SagaScenario.release(Policy(step_timeout_s=30, backoff_s=(0.5,)))
    first = s.expect_command("billing.stop_meter")
    s.advance(30)
    assert s.saga.record("stop_meter").finished_at is None       # retrying: still running
    s.advance(0.5)
    s.expect_command("billing.stop_meter")
    s.advance(10)
    s.succeed(first)
    rec = s.saga.record("stop_meter")
    assert (rec.attempt, rec.started_at, rec.finished_at) == (2, at(0), at(40.5))
