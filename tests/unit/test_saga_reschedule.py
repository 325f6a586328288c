"""The reschedule saga as a state machine: pause, fence and free the old placement, then place it again."""
from __future__ import annotations

import uuid

from services.saga.domain.definitions import RESCHEDULE
from tests.support.saga import SagaScenario

NEW_NODE = str(uuid.uuid4())


def _through_reserve(s: SagaScenario):
    s.succeed(s.expect_command("billing.stop_meter", step="pause_meter", compensates=None,
                               at="2029-12-31T23:59:50+00:00"))
    s.succeed(s.expect_command("network.detach_network", step="fence_network", compensates=None))
    free = s.expect_command("scheduler.release_slots", step="free_old_slots", compensates=None)
    assert [q["slot"] for q in free.data["quarantine"]] == [2, 3]   # unwiped: back only through a re-wipe
    s.succeed(free)
    return s.expect_command("scheduler.reserve_slots", step="reserve_slots", shape="vm.2gpu", gpu_count=2)


def test_a_move_of_an_allocation_created_without_volumes_still_asks_storage():
    """Volumes may have been attached since the allocation was created: they must let its new address in."""
    s = SagaScenario.reschedule(volume_gb=0)
    s.succeed(_through_reserve(s), node_id=NEW_NODE, slots=[0, 1], gpu_model="H100", pool="shared")
    s.succeed(s.expect_command("network.attach_network"), ip_address="10.0.0.7", mac_address="52:54:00:00:00:07",
              attachment={}, tenant_networks={})
    s.expect_command("storage.provision_volume", step="provision_volume", size_gb=0, ip_address="10.0.0.7")


def test_a_move_fences_the_old_placement_before_it_places_the_allocation_again():
    s = SagaScenario.reschedule()
    reserve = _through_reserve(s)
    s.succeed(reserve, node_id=NEW_NODE, slots=[0, 1], gpu_model="H100", pool="shared")
    attach = s.expect_command("network.attach_network", step="attach_network", node_id=NEW_NODE,
                              ip_address="10.0.0.7")                    # the address the tenant had
    s.succeed(attach, ip_address="10.0.0.7", mac_address="52:54:00:00:00:07", attachment={}, tenant_networks={})
    s.succeed(s.expect_command("storage.provision_volume", size_gb=50))
    s.succeed(s.expect_command("node_agent.provision", node_id=NEW_NODE), instance={"kind": "sim"})
    activate = s.expect_command("allocation.activate", node_id=NEW_NODE)   # billing meters it from its activation
    s.succeed(activate)
    s.expect_no_command()
    assert s.saga.status == "completed"
    assert s.events("saga.started")[0]["steps"] == RESCHEDULE.names


def test_a_move_that_cannot_be_placed_undoes_nothing_of_the_old_placement_and_fails_the_allocation():
    s = SagaScenario.reschedule()
    s.fail(_through_reserve(s), "no capacity")
    s.expect_command("allocation.fail", failed_step="reserve_slots")
    s.expect_no_command()          # the old placement stays fenced and freed: nothing of it is undone
    assert s.saga.status == "failed"


def test_a_move_that_fails_after_placing_undoes_the_new_placement():
    s = SagaScenario.reschedule()
    s.succeed(_through_reserve(s), node_id=NEW_NODE, slots=[0, 1], gpu_model="H100", pool="shared")
    s.succeed(s.expect_command("network.attach_network"), ip_address="10.0.0.9", mac_address="m", attachment={},
              tenant_networks={})
    s.fail(s.expect_command("storage.provision_volume"), "quota")
    undo = s.expect_command("network.detach_network")
    assert undo.data["compensates"] == f"{s.saga.id}:attach_network"
    assert not [c for c in s.unseen if c.data.get("step") in ("pause_meter", "fence_network", "free_old_slots")]


# --- bare metal: the old server powered off, confirmed, before anything is placed -------------------------------
def _bare_metal_fence(s: SagaScenario):
    s.succeed(s.expect_command("billing.stop_meter", step="pause_meter"))
    old = s.saga.input["from_node_id"]
    fence = s.expect_command("node_agent.fence_node", step="fence_node", node_id=old)
    assert fence.subject_params == {"node_id": old}      # the old node's agent, never the new one's
    s.expect_no_command()                                # nothing else goes out until the fence is confirmed
    return fence


def test_a_bare_metal_move_powers_the_old_server_off_before_it_fences_frees_and_places():
    s = SagaScenario.reschedule(bare_metal=True)
    s.succeed(_bare_metal_fence(s), node_id=s.saga.input["from_node_id"], power_state="off", seconds=1.2)
    s.succeed(s.expect_command("network.detach_network", step="fence_network"))
    s.succeed(s.expect_command("scheduler.release_slots", step="free_old_slots"))
    reserve = s.expect_command("scheduler.reserve_slots", step="reserve_slots")
    s.succeed(reserve, node_id=NEW_NODE, slots=[0, 1], gpu_model="H100", pool="shared")
    assert s.expect_command("network.attach_network").data["node_id"] == NEW_NODE   # the new node from here on


def _nothing_placed(s: SagaScenario, step: str, reason_part: str) -> None:
    failed = s.expect_command("allocation.fail", failed_step=step)
    assert reason_part in failed.data["reason"]
    s.expect_no_command()
    sent = {a.type for a in s.actions}
    assert not sent & {"scheduler.reserve_slots", "network.attach_network", "node_agent.provision",
                       "scheduler.release_slots", "network.detach_network"}
    assert s.saga.status == "failed"


def test_a_refused_fence_fails_the_allocation_and_places_nothing():
    s = SagaScenario.reschedule(bare_metal=True)
    s.fail(_bare_metal_fence(s), "fence not confirmed: power_off: the server did not power off within 60 s")
    _nothing_placed(s, "fence_node", "did not power off")


def test_a_fence_nobody_answers_times_out_and_fails_the_allocation_with_nothing_placed():
    s = SagaScenario.reschedule(bare_metal=True)
    _bare_metal_fence(s)
    assert s.policy.step_timeout_of("fence_node") == 180.0   # longer than the agent's own power-off bound
    s.advance(179)
    s.expect_no_command()
    s.advance(2)
    _nothing_placed(s, "fence_node", "timed out after 180s")


def test_a_vm_move_skips_the_power_fence():
    s = SagaScenario.reschedule()
    _through_reserve(s)
    assert not [a for a in s.actions if getattr(a, "type", "") == "node_agent.fence_node"]
    assert ("fence_node", "invoke", "succeeded") in s.step_changes()   # skipped: no bare_metal
