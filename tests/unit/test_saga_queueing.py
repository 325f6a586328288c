"""The allocate saga while the scheduler queues its reservation: given/expect, no I/O."""
from __future__ import annotations

import uuid

from services.saga.domain.model import Policy
from shared.wire import step_key
from tests.support.saga import SagaScenario

NODE = str(uuid.uuid4())
POLICY = Policy(step_timeout_s=30, queue_timeout_s=3600)


def queued(s: SagaScenario, cmd, position: int = 1, reason: str = "no capacity now") -> None:
    s.reply("scheduler.reservation_queued", "reserve_slots", cmd.data["idempotency_key"],
            tenant_id=str(s.saga.tenant_id), position=position, reason=reason)


def test_scheduling_options_of_the_request_reach_the_reserve_command():
    s = SagaScenario.allocate(POLICY, priority=50, spot=True, pool="spot", tolerations=["spot=true:NoSchedule"],
                              fail_fast=True, user_id=str(uuid.uuid4()))
    s.expect_command("scheduler.reserve_slots", priority=50, spot=True, pool="spot",
                     tolerations=["spot=true:NoSchedule"], fail_fast=True)


def test_options_the_request_did_not_give_are_left_out_so_the_command_defaults_apply():
    s = SagaScenario.allocate(POLICY)
    cmd = s.expect_command("scheduler.reserve_slots")
    assert not {"priority", "spot", "pool", "tolerations", "fail_fast", "user_id"} & set(cmd.data)


def test_a_queued_reservation_waits_past_the_step_timeout_until_the_queue_timeout():
    s = SagaScenario.allocate(POLICY)
    cmd = s.expect_command("scheduler.reserve_slots")
    queued(s, cmd, position=3)
    rec = s.saga.record("reserve_slots")
    assert (rec.status, rec.deadline) == ("waiting", s.now + POLICY.queue_timeout)
    assert s.step_changes()[-1] == ("reserve_slots", "invoke", "waiting")
    assert s.published_step_changes() == []      # scheduler.reservation_queued says it
    s.advance(POLICY.step_timeout_s + 1)
    assert s.saga.status == "running" and s.saga.record("reserve_slots").status == "waiting"
    s.succeed(cmd, node_id=NODE, slots=[0, 1], gpu_model="H100")
    s.expect_command("network.attach_network", node_id=NODE)


def test_a_duplicate_queued_reply_does_not_move_the_deadline_again():
    s = SagaScenario.allocate(POLICY)
    cmd = s.expect_command("scheduler.reserve_slots")
    queued(s, cmd)
    first = s.saga.record("reserve_slots").deadline
    s.advance(10)
    queued(s, cmd)
    assert s.saga.record("reserve_slots").deadline == first


def test_a_queued_reservation_that_never_gets_capacity_times_out_and_is_released():
    s = SagaScenario.allocate(POLICY)
    cmd = s.expect_command("scheduler.reserve_slots")
    queued(s, cmd)
    s.advance(POLICY.queue_timeout_s + 1)
    undo = s.expect_command("scheduler.release_slots", compensates=step_key(s.saga.id, "reserve_slots"))
    s.undone(undo)
    fail = s.expect_command("allocation.fail", failed_step="reserve_slots")
    assert "still queued after 3600s" in fail.data["reason"]


def test_a_cancelled_queued_reservation_fails_the_saga_without_compensation():
    s = SagaScenario.allocate(POLICY)
    cmd = s.expect_command("scheduler.reserve_slots")
    queued(s, cmd)
    s.fail(cmd, "cancelled by the tenant")
    fail = s.expect_command("allocation.fail", failed_step="reserve_slots")
    assert fail.data["reason"] == "cancelled by the tenant"


def test_a_queued_reply_for_another_saga_changes_nothing():
    s = SagaScenario.allocate(POLICY)
    s.expect_command("scheduler.reserve_slots")
    s.reply("scheduler.reservation_queued", "reserve_slots", step_key(uuid.uuid4(), "reserve_slots"),
            tenant_id=str(s.saga.tenant_id), position=1, reason="x")
    assert s.saga.record("reserve_slots").status == "invoked"


def test_network_choice_and_attach_results_flow_to_the_node_agent():
    net = str(uuid.uuid4())
    s = SagaScenario.allocate(POLICY, network_id=net)
    s.succeed(s.expect_command("scheduler.reserve_slots"), node_id=NODE, slots=[0], gpu_model="H100")
    attach = s.expect_command("network.attach_network", network_id=net)
    attachment = {"attachment_id": str(uuid.uuid4()), "ip_address": "10.0.0.2"}
    tenant_networks = {"tenant_id": str(s.saga.tenant_id), "version": 1, "networks": []}
    s.succeed(attach, attachment_id=attachment["attachment_id"], vni=5000, ip_address="10.0.0.2",
              mac_address="02:00:00:00:00:02", attachment=attachment, tenant_networks=tenant_networks)
    s.succeed(s.expect_command("storage.provision_volume"), volume_id=str(uuid.uuid4()), size_gb=50)
    s.expect_command("node_agent.provision", attachment=attachment, tenant_networks=tenant_networks)
