"""The allocate saga as a state machine: given/expect, no I/O."""
from __future__ import annotations

import uuid

import pytest

from services.saga.domain.definitions import ALLOCATE
from services.saga.domain.machine import compensation_key, handle
from services.saga.domain.model import Command, Event, Expired, Policy, Start
from shared.wire import step_key
from tests.support.saga import SagaScenario

NODE, VOLUME = str(uuid.uuid4()), str(uuid.uuid4())
PORT = {"leaf": "leaf-1", "port": "swp1"}
# what each step's participant answers on success
OK_DATA = {
    "reserve_slots": {"node_id": NODE, "slots": [2, 3], "gpu_model": "H100", "pool": "west"},
    "attach_network": {"attachment_id": str(uuid.uuid4()), "vni": 4100, "ip_address": "10.0.0.5",
                       "mac_address": "02:00:00:00:00:05"},
    "provision_volume": {"volume_id": VOLUME, "size_gb": 50},
    # a bare-metal server: its node-agent reports where its NIC is cabled, so its port moves at hand-off
    "provision_node": {"node_id": NODE, "instance_id": "bm-1",
                       "instance": {"instance_id": "bm-1", "driver": "redfish", "switch_port": PORT,
                                    "hca_guids": ["0x0002c90300a1b2c3"], "phases": [{"name": "deploy", "seconds": 9.5}]}},
    "bind_port": {"network_id": str(uuid.uuid4()), "leaf": "leaf-1", "port": "swp1", "vlan": 2, "vni": 4100,
                  "moved_s": 0.25},
    "activate": {"node_id": NODE, "state": "ACTIVE"},
}
STEPS = ALLOCATE.names
COMPENSATIONS = {s.name: s.compensate for s in ALLOCATE.steps}


def run_until(s: SagaScenario, step: str):
    """Answer every step before ``step`` with success; return the command of ``step``."""
    for st in ALLOCATE.steps:
        cmd = s.expect_command(st.invoke, step=st.name)
        if st.name == step:
            return cmd
        s.succeed(cmd, **OK_DATA[st.name])
    raise AssertionError(step)


def expect_compensations(s: SagaScenario, steps: list[str]) -> None:
    for name in steps:
        cmd = s.expect_command(COMPENSATIONS[name], step=name)
        s.undone(cmd)


def test_start_announces_the_saga_and_reserves_slots_telling_the_allocation_nothing():
    """The allocation stays REQUESTED until it is activated: the start's first command is the reservation."""
    s = SagaScenario.allocate()
    cmd = s.expect_command("scheduler.reserve_slots", shape="vm.2gpu", gpu_count=2, step="reserve_slots",
                           idempotency_key=step_key(s.saga.id, "reserve_slots"), labels={"team": "ml"})
    assert cmd.data["tenant_id"] == s.saga.tenant_id
    assert s.events("saga.started")[0]["steps"] == STEPS
    assert s.saga.record("reserve_slots").status == "invoked"
    assert s.saga.record("reserve_slots", "compensate").status == "armed"   # armed with the invoke
    assert s.saga.record("reserve_slots").deadline == s.now + Policy().step_timeout("reserve_slots")


def test_every_step_succeeding_sends_commands_in_order_with_earlier_results_and_completes():
    s = SagaScenario.allocate()
    sent = {}
    for st in ALLOCATE.steps:
        sent[st.name] = s.expect_command(st.invoke, step=st.name, idempotency_key=step_key(s.saga.id, st.name),
                                         labels={"team": "ml"})
        s.succeed(sent[st.name], **OK_DATA[st.name])
    assert sent["attach_network"].data["node_id"] == NODE
    assert sent["provision_volume"].data["size_gb"] == 50
    node = sent["provision_node"]
    assert (node.data["node_id"], node.data["slots"], node.data["volume_id"]) == (NODE, [2, 3], VOLUME)
    assert (node.data["ip_address"], node.data["mac_address"]) == ("10.0.0.5", "02:00:00:00:00:05")
    assert node.subject_params == {"node_id": NODE}
    assert sent["bind_port"].data["switch_port"] == PORT
    assert sent["bind_port"].data["hca_guids"] == ["0x0002c90300a1b2c3"]
    assert sent["activate"].data["node_id"] == NODE
    # the activated event tells billing where the GPUs were reserved: it meters the allocation from it
    assert (sent["activate"].data["gpu_model"], sent["activate"].data["pool"]) == ("H100", "west")
    instance = sent["activate"].data["instance"]   # the port's move is a phase; the server is the tenant's
    assert instance["network_phase"] == "tenant"
    assert instance["phases"] == [{"name": "deploy", "seconds": 9.5}, {"name": "port_to_tenant", "seconds": 0.25}]
    s.expect_no_command()
    assert s.saga.status == "completed"
    assert len(s.events("saga.completed")) == 1 and not s.events("saga.failed")
    assert [c for c in s.step_changes() if c[2] == "succeeded"] == [(n, "invoke", "succeeded") for n in STEPS]
    assert [c for c in s.step_changes() if c[2] == "invoked"] == [(n, "invoke", "invoked") for n in STEPS]


def test_a_successful_allocation_publishes_its_commands_and_the_saga_start_and_end_but_no_step_change():
    """Each step's command says it was invoked and the participant's reply that it succeeded."""
    s = SagaScenario.allocate()
    s.succeed(run_until(s, "activate"), **OK_DATA["activate"])
    assert s.saga.status == "completed"
    assert len(s.step_changes()) == 2 * len(STEPS) and s.published_step_changes() == []
    assert [a.type for a in s.actions if isinstance(a, Event)] == ["saga.started", "saga.completed"]
    assert [a.type for a in s.actions if isinstance(a, Command)] == [st.invoke for st in ALLOCATE.steps]


@pytest.mark.parametrize("failing", STEPS)
def test_failure_at_any_step_undoes_the_completed_steps_in_reverse_then_fails_the_allocation(failing):
    s = SagaScenario.allocate()
    cmd = run_until(s, failing)
    s.fail(cmd, f"{failing} refused: no capacity")
    done = STEPS[:STEPS.index(failing)]
    expect_compensations(s, list(reversed(done)))
    s.expect_command("allocation.fail", failed_step=failing, reason=f"{failing} refused: no capacity",
                     saga_id=s.saga.id, allocation_id=s.saga.allocation_id)
    s.expect_no_command()
    assert s.saga.status == "failed"
    failed = s.events("saga.failed")
    assert len(failed) == 1 and failed[0]["compensated"] == list(reversed(done))
    assert (failing, "invoke", "failed") in s.step_changes()
    assert s.published_step_changes() == []     # the refusal, the undo commands and their replies say it all
    assert s.saga.record(failing, "compensate") is None or s.saga.record(failing, "compensate").status == "disarmed"


@pytest.mark.parametrize("silent", STEPS)
def test_timeout_at_any_step_compensates_that_step_first_then_the_earlier_ones(silent):
    s = SagaScenario.allocate()
    run_until(s, silent)
    timeout = Policy().step_timeout_of(silent)   # 30 s, but a VM's boot (provision_node) may take 600
    s.advance(timeout - 0.1)
    s.expect_no_command()
    s.advance(0.1)
    assert s.saga.record(silent).status == "timed_out"
    undo = [n for n in reversed(STEPS[:STEPS.index(silent) + 1]) if COMPENSATIONS[n]]
    expect_compensations(s, undo)
    s.expect_command("allocation.fail", failed_step=silent, reason=f"timed out after {timeout:g}s")
    s.expect_no_command()
    assert s.events("saga.failed")[0]["compensated"] == undo
    assert s.published_step_changes() == [(silent, "invoke", "timed_out")]   # nothing else on the bus says it


def test_compensation_commands_name_the_step_they_undo_and_carry_labels_and_the_node():
    s = SagaScenario.allocate()
    s.fail(run_until(s, "activate"), "the allocation failed meanwhile")
    sid = s.saga.id
    # the server's port goes back to the provisioning network before the server is powered off
    s.undone(s.expect_command("network.unbind_port", step="bind_port", compensates=step_key(sid, "bind_port")))
    cmd = s.expect_command("node_agent.deprovision", step="provision_node", saga_id=sid, node_id=NODE,
                           idempotency_key=compensation_key(sid, "provision_node"),
                           compensates=step_key(sid, "provision_node"), labels={"team": "ml"})
    assert cmd.subject_params == {"node_id": NODE}
    assert cmd.data["idempotency_key"] == f"{sid}:compensate:provision_node"


def test_a_vm_slice_has_no_port_to_move():
    """No switch port in the instance (a VM slice, or a server whose cabling is not known): bind_port is skipped."""
    s = SagaScenario.allocate()
    for st in ALLOCATE.steps[:4]:
        s.succeed(s.expect_command(st.invoke, step=st.name), **OK_DATA[st.name] | (
            {"instance": {"instance_id": "vm-1", "driver": "libvirt"}} if st.name == "provision_node" else {}))
    assert s.saga.record("bind_port").status == "succeeded"
    assert s.published_step_changes() == []   # a skip where the step never applies is recorded, not published
    assert "network_phase" not in s.expect_command("allocation.activate").data["instance"]


def test_late_success_of_a_timed_out_step_is_ignored_while_it_is_compensated():
    s = SagaScenario.allocate()
    cmd = run_until(s, "provision_volume")
    s.advance(30)
    detach_volume = s.expect_command("storage.delete_volume", step="provision_volume")
    assert s.succeed(cmd, **OK_DATA["provision_volume"]) == []    # the late reply changes nothing
    assert s.fail(cmd, "late failure") == []
    s.undone(detach_volume)
    expect_compensations(s, ["attach_network", "reserve_slots"])
    s.expect_command("allocation.fail", failed_step="provision_volume")
    assert s.succeed(cmd, **OK_DATA["provision_volume"]) == []    # ... and after the end too
    assert s.saga.status == "failed"


def test_duplicate_stale_and_mismatched_replies_change_nothing():
    s = SagaScenario.allocate()
    reserve = s.expect_command("scheduler.reserve_slots")
    sid = s.saga.id
    # wrong key, unknown step, a reply type that does not belong to the step, an undo nobody asked for
    stale = step_key(uuid.uuid4(), "reserve_slots")
    assert s.reply("scheduler.slots_reserved", "reserve_slots", stale, **OK_DATA["reserve_slots"]) == []
    assert s.reply("scheduler.slots_reserved", "no_such_step", step_key(sid, "no_such_step")) == []
    assert s.reply("network.network_attached", "reserve_slots", step_key(sid, "reserve_slots")) == []
    assert s.reply("scheduler.slots_released", "reserve_slots", compensation_key(sid, "reserve_slots")) == []
    assert s.saga.record("reserve_slots").status == "invoked"
    s.succeed(reserve, **OK_DATA["reserve_slots"])
    before = s.saga
    assert s.succeed(reserve, **OK_DATA["reserve_slots"]) == []     # duplicate
    assert s.fail(reserve, "stale failure") == []                   # stale
    assert s.saga == before
    s.expect_command("network.attach_network")
    s.expect_no_command()


def test_a_reply_before_the_deadline_means_no_timeout_and_a_second_start_does_nothing():
    s = SagaScenario.allocate()
    s.advance(29)
    s.succeed(s.expect_command("scheduler.reserve_slots"), **OK_DATA["reserve_slots"])
    s.advance(29)
    assert s.saga.status == "running" and s.saga.record("reserve_slots").status == "succeeded"
    assert handle(s.saga, Start(s.now), s.policy) == (s.saga, [], [])
    early = Expired("attach_network", "invoke", s.now)             # its deadline is 1 s away
    assert handle(s.saga, early, s.policy) == (s.saga, [], [])


def test_unanswered_compensation_is_resent_with_backoff_then_reported_and_the_earlier_ones_still_run():
    s = SagaScenario.allocate(Policy(compensation_timeout_s=10, compensation_attempts=3, backoff_s=(0.5, 1)))
    s.fail(run_until(s, "provision_volume"), "quota exceeded")
    first = s.expect_command("network.detach_network")
    s.advance(10)                                   # no reply: wait the first backoff
    s.expect_no_command()
    s.advance(0.5)
    again = s.expect_command("network.detach_network", idempotency_key=first.data["idempotency_key"])
    assert s.saga.record("attach_network", "compensate").attempt == 2
    s.advance(10 + 1)
    s.expect_command("network.detach_network")
    assert s.saga.record("attach_network", "compensate").attempt == 3
    s.advance(10)                                   # the third attempt was the last
    gave_up = s.events("saga.compensation_failed")
    assert len(gave_up) == 1 and gave_up[0]["step"] == "attach_network" and gave_up[0]["attempts"] == 3
    assert s.saga.record("attach_network", "compensate").status == "failed"
    s.undone(s.expect_command("scheduler.release_slots"))
    s.expect_command("allocation.fail", failed_step="provision_volume", reason="quota exceeded")
    assert s.events("saga.failed")[0]["compensated"] == ["reserve_slots"]
    assert again.data == first.data
    # the resends are commands of their own; the waits and the giving up are known to the coordinator only
    assert s.published_step_changes() == [
        ("attach_network", "compensate", "retrying"), ("attach_network", "compensate", "retrying"),
        ("attach_network", "compensate", "failed")]


def test_a_late_undo_reply_during_the_backoff_wait_is_accepted_and_duplicates_are_ignored():
    s = SagaScenario.allocate()
    s.fail(run_until(s, "attach_network"), "no vni left")
    release = s.expect_command("scheduler.release_slots")
    s.advance(10)
    assert s.saga.record("reserve_slots", "compensate").status == "retrying"
    s.undone(release)                                              # the first attempt's reply, late
    s.expect_command("allocation.fail", failed_step="attach_network", reason="no vni left")
    assert s.undone(release) == []
    s.advance(60)
    s.expect_no_command()
    assert [c for c in s.step_changes() if c[1] == "compensate"] == [
        ("reserve_slots", "compensate", "compensating"), ("reserve_slots", "compensate", "retrying"),
        ("reserve_slots", "compensate", "compensated")]
    assert s.published_step_changes() == [("reserve_slots", "compensate", "retrying")]


def test_the_machine_never_mutates_the_saga_it_is_given():
    s = SagaScenario.allocate()
    reserve = s.expect_command("scheduler.reserve_slots")
    before = s.saga
    snapshot = repr(before)
    s.succeed(reserve, **OK_DATA["reserve_slots"])
    assert repr(before) == snapshot and s.saga is not before


def test_the_named_volumes_go_to_storage_and_their_exports_to_the_node():
    """The request's volumes and scratch class reach provision_volume with the node and the slot's address (the
    client the export allows); the exports storage answers with are what provision_node mounts."""
    named = [{"volume_id": str(uuid.uuid4()), "mode": "ro"}]
    user = str(uuid.uuid4())
    s = SagaScenario.allocate(volumes=named, scratch_class="lustre", user_id=user)
    for st in ALLOCATE.steps[:2]:
        s.succeed(s.expect_command(st.invoke, step=st.name), **OK_DATA[st.name])
    cmd = s.expect_command("storage.provision_volume", step="provision_volume")
    assert {k: cmd.data[k] for k in ("size_gb", "scratch_class", "volumes", "user_id", "node_id", "ip_address")} == {
        "size_gb": 50, "scratch_class": "lustre", "volumes": named, "user_id": user, "node_id": NODE,
        "ip_address": "10.0.0.5"}
    exports = [{"volume_id": named[0]["volume_id"], "name": "data", "mode": "ro", "backend": "btrfs",
                "source": "/srv/volumes/tenants/t/v", "options": {}}]
    s.succeed(cmd, volume_id=VOLUME, size_gb=50, exports=exports)
    node = s.expect_command("node_agent.provision", step="provision_node")
    assert node.data["volumes"] == exports and node.data["volume_id"] == VOLUME


def test_without_volumes_storage_is_not_asked_and_the_node_is_told_of_none():
    """No scratch and no named volume: provision_volume has nothing to do, so it is skipped (recorded, not
    published: the common case of a VM slice) and has nothing to undo."""
    s = SagaScenario.allocate(volume_gb=0)
    for st in ALLOCATE.steps[:2]:
        s.succeed(s.expect_command(st.invoke, step=st.name), **OK_DATA[st.name])
    node = s.expect_command("node_agent.provision", step="provision_node")
    assert "volumes" not in node.data and node.data.get("volume_id") is None
    assert s.saga.record("provision_volume").status == "succeeded"
    assert [c.detail for c in s.changes if c.step == "provision_volume"] == ["skipped: no volumes"]
    assert s.saga.record("provision_volume", "compensate") is None
    assert s.published_step_changes() == []
    s.fail(node, "no such image")          # a failure later undoes the steps that ran, and only those
    expect_compensations(s, ["attach_network", "reserve_slots"])


def test_named_volumes_without_scratch_still_go_to_storage():
    s = SagaScenario.allocate(volume_gb=0, volumes=[{"volume_id": str(uuid.uuid4()), "mode": "ro"}])
    for st in ALLOCATE.steps[:2]:
        s.succeed(s.expect_command(st.invoke, step=st.name), **OK_DATA[st.name])
    assert s.expect_command("storage.provision_volume", step="provision_volume", size_gb=0).data["volumes"]
