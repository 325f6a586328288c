"""The release saga as a state machine: forward-only, every step resent with backoff until confirmed."""
from __future__ import annotations

from services.saga.domain.definitions import RELEASE
from services.saga.domain.model import Policy
from shared.wire import step_key
from tests.support.saga import SagaScenario

ORDER = [("billing.stop_meter", "stop_meter"), ("node_agent.deprovision", "deprovision_node"),
         ("network.unbind_port", "unbind_port"),
         ("node_agent.wipe_slots", "wipe_slots"), ("storage.delete_volume", "delete_volume"),
         ("network.detach_network", "detach_network"),
         ("scheduler.release_slots", "release_slots"), ("allocation.mark_released", "mark_released")]


def test_release_runs_every_step_in_order_and_completes():
    """A bare-metal server's (its port is known): its port returns to the provisioning network before the wipe."""
    s = SagaScenario.release(switch_port={"leaf": "leaf-1", "port": "swp1"})
    node = s.saga.input["node_id"]
    for type_, step in ORDER:
        cmd = s.expect_command(type_, step=step, idempotency_key=step_key(s.saga.id, step), labels={"team": "ml"},
                               saga_id=s.saga.id, allocation_id=s.saga.allocation_id)
        if type_ in ("allocation.mark_released", "node_agent.wipe_slots"):
            assert "compensates" not in cmd.data          # plain step commands: nothing of the allocate saga undone
        else:
            assert cmd.data["compensates"] is None        # release steps undo, but compensate nothing
        if step in ("deprovision_node", "wipe_slots"):
            assert cmd.data["node_id"] == node and cmd.subject_params == {"node_id": node}
        if step == "wipe_slots":   # a slot whose wipe failed goes to release_slots as quarantined
            s.succeed(cmd, quarantine=[{"slot": 3, "reason": "blkdiscard failed"}])
            continue
        if step == "release_slots":
            assert cmd.data["quarantine"] == [{"slot": 3, "reason": "blkdiscard failed"}]
        s.succeed(cmd)
    s.expect_no_command()
    assert s.saga.status == "completed" and len(s.events("saga.completed")) == 1
    assert s.events("saga.started")[0]["steps"] == RELEASE.names
    assert s.published_step_changes() == []         # each command and its reply say every step change


def test_unconfirmed_release_step_is_resent_with_backoff_and_a_late_reply_is_accepted():
    s = SagaScenario.release(Policy(step_timeout_s=30, backoff_s=(0.5, 1, 2)))
    first = s.expect_command("billing.stop_meter")
    s.advance(30)
    s.expect_no_command()                               # waiting the first backoff
    assert s.saga.record("stop_meter").status == "retrying"
    s.advance(0.5)
    second = s.expect_command("billing.stop_meter")
    assert second.data == first.data                    # same key: the participant acts once
    s.advance(30 + 1)
    s.expect_command("billing.stop_meter")
    assert s.saga.record("stop_meter").attempt == 3
    s.advance(30)                                       # third attempt unanswered ...
    s.succeed(first)                                    # ... then the first one's reply arrives
    s.expect_command("node_agent.deprovision")
    assert s.succeed(first) == []                       # duplicate
    assert [c[2] for c in s.step_changes() if c[0] == "stop_meter"] == [
        "invoked", "retrying", "invoked", "retrying", "invoked", "retrying", "succeeded"]
    assert [c[2] for c in s.published_step_changes() if c[0] == "stop_meter"] == ["retrying"] * 3


def test_release_step_unconfirmed_after_every_attempt_is_reported_and_fails_the_allocation():
    s = SagaScenario.release(Policy(step_timeout_s=5, release_attempts=3, backoff_s=(1,)))
    s.succeed(s.expect_command("billing.stop_meter"))
    for _ in range(3):
        s.expect_command("node_agent.deprovision")
        s.advance(6)
    s.expect_command("allocation.fail", failed_step="deprovision_node", saga_id=s.saga.id,
                     reason="deprovision_node unconfirmed after 3 attempts (timed out after 5s each)")
    s.expect_no_command()
    report = s.events("saga.compensation_failed")
    assert len(report) == 1 and report[0]["step"] == "deprovision_node" and report[0]["attempts"] == 3
    assert s.saga.status == "failed" and s.events("saga.failed")[0]["failed_step"] == "deprovision_node"
    assert s.published_step_changes() == [("deprovision_node", "invoke", "retrying")] * 2 + [
        ("deprovision_node", "invoke", "failed")]                # the coordinator gave up: published
    s.advance(600)
    s.expect_no_command()


def test_release_without_a_node_skips_deprovisioning():
    s = SagaScenario.release(node_id=None)
    s.succeed(s.expect_command("billing.stop_meter"))
    s.expect_command("storage.delete_volume")
    assert s.saga.record("deprovision_node").status == "succeeded"
    assert s.saga.record("wipe_slots").status == "succeeded"   # nothing placed, nothing to wipe
    assert any(e["step"] == "deprovision_node" and "skipped" in (e["detail"] or "") for e in s.events("saga.step_changed"))
    assert s.published_step_changes() == [("deprovision_node", "invoke", "succeeded"),   # no command says a skip
                                          ("wipe_slots", "invoke", "succeeded")]   # unbind_port's skip: no news
    assert s.saga.record("unbind_port").status == "succeeded"
