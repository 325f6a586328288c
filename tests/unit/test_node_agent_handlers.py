"""The node-agent's handlers over in-memory records, the sim driver and a recording unit of work (no I/O): what
provision and deprovision leave on the node and in its records, what a power action or a live mount answers,
and what a wipe, a burn-in and a BMC registration record and answer."""
from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from services.node_agent import contracts as c
from services.node_agent import handlers
from services.node_agent.adapters.drivers import SimDriver
from services.node_agent.domain.wipe import DEFAULT_POLICY
from services.scheduler.contracts import SlotDetail
from services.storage.contracts import VolumeExport
from shared.envelope import utcnow
from shared.participant import StepRejected
from shared.refusals import PermanentError
from shared.wire import step_key
from tests.support.fakes import FakeUnitOfWork
from tests.support.node_agent import FakeBurnIn, FakeNodeRecords, FakeWiper, sim_node

TENANT = uuid.uuid4()


def provision_cmd(node, *, slots=(0, 1), tenant: uuid.UUID = TENANT, volumes=()) -> c.ProvisionNode:
    saga = uuid.uuid4()
    return c.ProvisionNode(saga_id=saga, step="provision", idempotency_key=step_key(saga, "provision"),
                           allocation_id=uuid.uuid4(), tenant_id=tenant, node_id=node.id, slots=list(slots),
                           volumes=list(volumes))


def deprovision_cmd(cmd: c.ProvisionNode) -> c.DeprovisionNode:
    return c.DeprovisionNode(saga_id=cmd.saga_id, step=cmd.step, idempotency_key=step_key(cmd.saga_id, "undo"),
                             allocation_id=cmd.allocation_id, tenant_id=cmd.tenant_id, node_id=cmd.node_id,
                             compensates=cmd.idempotency_key)


async def provisioned(node, records: FakeNodeRecords, **kw) -> c.ProvisionNode:
    cmd = provision_cmd(node, **kw)
    await handlers.provision_step(records, cmd, node=node)
    return cmd


def power_cmd(node, cmd: c.ProvisionNode, action: str = "stop", *, tenant: uuid.UUID = TENANT,
              expires_in_s: float = 60) -> c.RequestPower:
    return c.RequestPower(request_id=uuid.uuid4(), allocation_id=cmd.allocation_id, tenant_id=tenant, node_id=node.id,
                          action=action, requested_by=uuid.uuid4(), expires_at=utcnow() + timedelta(seconds=expires_in_s))


def export(name: str = "data") -> VolumeExport:
    return VolumeExport(volume_id=uuid.uuid4(), name=name, mode="rw", backend="vast", source="vip:/t/v")


async def handle(handler, type_: str, cmd, node) -> FakeUnitOfWork:
    uow = FakeUnitOfWork("node_agent", type_, cmd)
    await handler(uow, cmd, node=node)
    return uow


# --- provision and deprovision ---------------------------------------------------------------------------------
async def test_provision_makes_the_instance_and_keeps_it_with_its_command(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    cmd = provision_cmd(node)
    reply = await handlers.provision_step(records, cmd, node=node)
    [running] = await node.driver.list_instances()
    assert (reply["node_id"], reply["instance_id"]) == (node.id, running.instance_id)
    assert (reply["instance"]["driver"], reply["instance"]["dataplane"]) == ("sim", "none")
    kept = records.kept[cmd.allocation_id]
    assert (kept.instance_id, kept.slots) == (running.instance_id, (0, 1))
    assert c.ProvisionNode.model_validate_json(kept.command) == cmd
    assert await handlers.provision_step(records, cmd, node=node) == reply     # the driver is idempotent


async def test_a_provision_the_driver_or_the_request_refuses_is_rejected_and_records_nothing(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records, driver=SimDriver(fail=["provision"]))
    with pytest.raises(StepRejected, match="injected failure of provision"):
        await handlers.provision_step(records, provision_cmd(node), node=node)
    with pytest.raises(StepRejected):
        await handlers.provision_step(records, provision_cmd(node, slots=()), node=node)
    assert records.kept == {}


async def test_a_command_for_another_node_is_refused_before_anything_is_locked(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    other = sim_node(tmp_path)
    cmd = provision_cmd(other)
    with pytest.raises(PermanentError, match="arrived at node"):
        await handle(handlers.provision_node, "node_agent.provision_node", cmd, node)
    with pytest.raises(PermanentError, match="arrived at node"):
        await handle(handlers.deprovision_node, "node_agent.deprovision_node", deprovision_cmd(cmd), node)
    assert records.locks == []


async def test_deprovision_removes_the_instance_and_its_record_and_is_safe_when_nothing_was_made(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    cmd = await provisioned(node, records)
    assert await handlers.deprovision_step(records, deprovision_cmd(cmd), node=node) == {"node_id": node.id}
    assert await node.driver.list_instances() == [] and records.kept == {}
    never = deprovision_cmd(provision_cmd(node))
    assert await handlers.deprovision_step(records, never, node=node) == {"node_id": node.id}


# --- power ----------------------------------------------------------------------------------------------------
async def test_a_power_action_on_the_tenants_instance_answers_the_state_after_it(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    cmd = await provisioned(node, records)
    uow = await handle(handlers.power, "node_agent.power", power_cmd(node, cmd, "stop"), node)
    changed = c.PowerChanged.model_validate(uow.only("node_agent.power_changed").data)
    assert (changed.ok, changed.power_state, changed.reason) == (True, "stopped", None)
    assert records.locks == [cmd.allocation_id]


async def test_a_power_action_on_another_tenants_or_a_missing_instance_is_refused_without_acting(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    cmd = await provisioned(node, records)
    for request in (power_cmd(node, cmd, tenant=uuid.uuid4()), power_cmd(node, provision_cmd(node))):
        uow = await handle(handlers.power, "node_agent.power", request, node)
        changed = c.PowerChanged.model_validate(uow.only("node_agent.power_changed").data)
        assert (changed.ok, changed.power_state) == (False, "unknown")
        assert changed.reason == f"allocation {request.allocation_id} has no instance on node {node.id}"
    assert (await node.driver.instance_info(cmd.allocation_id))["power_state"] == "running"


async def test_an_expired_power_action_is_refused_with_the_state_as_it_is(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    cmd = await provisioned(node, records)
    uow = await handle(handlers.power, "node_agent.power", power_cmd(node, cmd, "stop", expires_in_s=-1), node)
    changed = c.PowerChanged.model_validate(uow.only("node_agent.power_changed").data)
    assert (changed.ok, changed.power_state) == (False, "running") and changed.reason.startswith("expired: ")


# --- live mounts ----------------------------------------------------------------------------------------------
async def test_a_live_mount_answers_the_mount_and_keeps_the_volume_with_the_instances_command(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    cmd, volume = await provisioned(node, records), export()
    mount = c.MountVolume(allocation_id=cmd.allocation_id, tenant_id=TENANT, export=volume)
    uow = await handle(handlers.mount_volume, "node_agent.mount_volume", mount, node)
    changed = c.VolumeMountChanged.model_validate(uow.only("node_agent.volume_mount_changed").data)
    assert (changed.ok, changed.mounted, changed.mount.mount_point) == (True, True, "/mnt/data")
    kept = c.ProvisionNode.model_validate_json(await records.command_of(cmd.allocation_id))
    assert [v.volume_id for v in kept.volumes] == [volume.volume_id]

    unmount = c.UnmountVolume(allocation_id=cmd.allocation_id, tenant_id=TENANT, volume_id=volume.volume_id)
    uow = await handle(handlers.unmount_volume, "node_agent.unmount_volume", unmount, node)
    changed = c.VolumeMountChanged.model_validate(uow.only("node_agent.volume_mount_changed").data)
    assert (changed.ok, changed.mounted) == (True, False)
    assert c.ProvisionNode.model_validate_json(await records.command_of(cmd.allocation_id)).volumes == []


async def test_a_mount_for_another_tenants_allocation_is_refused_and_mounts_nothing(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    cmd = await provisioned(node, records)
    mount = c.MountVolume(allocation_id=cmd.allocation_id, tenant_id=uuid.uuid4(), export=export())
    uow = await handle(handlers.mount_volume, "node_agent.mount_volume", mount, node)
    changed = c.VolumeMountChanged.model_validate(uow.only("node_agent.volume_mount_changed").data)
    assert (changed.ok, changed.mounted) == (False, False) and "has no instance on node" in changed.reason
    assert (await node.driver.instance_info(cmd.allocation_id))["mounts"] == []


# --- the wipe, the burn-in, the BMC ---------------------------------------------------------------------------
def detail(index: int, policy: str | None = None) -> SlotDetail:
    return SlotDetail(index=index, gpu_pci=f"0000:0{index}:00.0", nvme_pci=f"0000:1{index}:00.0", ib_vf_pci="",
                      ib_guid="", numa=0, nvlink_domain=0, wipe_policy=policy)


async def test_the_wipe_records_every_slots_evidence_and_quarantines_the_slots_it_failed(tmp_path):
    records, wiper = FakeNodeRecords(), FakeWiper(1)
    node = sim_node(tmp_path, records=records, wiper=wiper)
    saga = uuid.uuid4()
    cmd = c.WipeSlots(saga_id=saga, step="wipe_slots", idempotency_key=step_key(saga, "wipe_slots"),
                      allocation_id=uuid.uuid4(), tenant_id=TENANT, node_id=node.id, slots=[0],
                      slot_details=[detail(1, "discard")])
    reply = await handlers.wipe_step(records, cmd, node=node)
    assert sorted(wiper.calls) == [(0, DEFAULT_POLICY), (1, "discard")]
    assert reply["quarantine"] == [{"slot": 1, "reason": "injected"}]
    assert [(e.slot, e.ok, a) for e, a, _ in records.wipes] == [(0, True, cmd.allocation_id), (1, False, cmd.allocation_id)]


async def test_a_rewipe_answers_its_outcome_and_records_it_under_its_request(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records, wiper=FakeWiper(2))
    cmd = c.Rewipe(request_id=uuid.uuid4(), node_id=node.id, slot=2, requested_by=uuid.uuid4())
    uow = await handle(handlers.rewipe, "node_agent.rewipe", cmd, node)
    rewiped = c.SlotRewiped.model_validate(uow.only("node_agent.slot_rewiped").data)
    assert (rewiped.slot, rewiped.ok) == (2, False)
    assert [(e.slot, request) for e, _, request in records.wipes] == [(2, cmd.request_id)]


async def test_the_burn_in_answers_whether_every_check_passed(tmp_path):
    node = sim_node(tmp_path, burn_in=FakeBurnIn("temperature"))
    cmd = c.RunBurnIn(node_id=node.id, run_id=uuid.uuid4())
    uow = await handle(handlers.burn_in, "node_agent.burn_in", cmd, node)
    finished = c.BurnInFinished.model_validate(uow.only("node_agent.burn_in_finished").data)
    assert finished.passed is False
    assert [(ch.name, ch.ok) for ch in finished.checks] == [("gpus_present", True), ("temperature", False)]


async def test_the_highest_bmc_version_wins(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    bmc = c.Bmc(url="https://bmc.example", system_id="/redfish/v1/Systems/1", username="admin", password_sealed="x")

    def set_bmc(version: int, url: str) -> c.SetBmc:
        return c.SetBmc(node_id=node.id, bmc=bmc.model_copy(update={"url": url}), version=version, set_by=uuid.uuid4())
    for version, url in ((2, "https://two.example"), (1, "https://one.example")):
        await handle(handlers.set_bmc, "node_agent.set_bmc", set_bmc(version, url), node)
    assert (await records.bmc()).url == "https://two.example"
