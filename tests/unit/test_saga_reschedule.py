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


def test_a_move_fences_the_old_placement_before_it_places_the_allocation_again():
    s = SagaScenario.reschedule()
    reserve = _through_reserve(s)
    s.succeed(reserve, node_id=NEW_NODE, slots=[0, 1], gpu_model="H100", pool="shared")
    attach = s.expect_command("network.attach_network", step="attach_network", node_id=NEW_NODE,
                              ip_address="10.0.0.7")                    # the address the tenant had
    s.succeed(attach, ip_address="10.0.0.7", mac_address="52:54:00:00:00:07", attachment={}, tenant_networks={})
    s.succeed(s.expect_command("storage.provision_volume", size_gb=50))
    s.succeed(s.expect_command("node_agent.provision", node_id=NEW_NODE), instance={"kind": "sim"})
    s.succeed(s.expect_command("billing.start_meter"))
    s.succeed(s.expect_command("allocation.activate", node_id=NEW_NODE))
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
