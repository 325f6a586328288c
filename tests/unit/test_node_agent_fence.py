"""The fence_node step on the node: the allocation runs no more there (bare metal: the server powered off through
its BMC and read back as Off), and the node forgets it, so no reconcile brings it back. Over the fakes; the BMC is
a stand-in for sushy's client (the real one is exercised against an emulator in the redfish integration tests)."""
from __future__ import annotations

import uuid

import pytest

from services.node_agent import contracts as c
from services.node_agent import handlers
from services.node_agent.adapters.drivers.redfish import driver as redfish
from services.node_agent.adapters.drivers.redfish.bmc import BmcConfig
from services.node_agent.adapters.drivers.redfish.config import RedfishConfig
from services.node_agent.adapters.drivers.redfish.records import instance_id
from shared.participant import StepRejected
from shared.refusals import PermanentError
from shared.wire import step_key
from tests.support.fakes import FakeUnitOfWork
from tests.support.node_agent import FakeNodeRecords, sim_node
from tests.unit.test_node_agent_handlers import provisioned


def fence_cmd(node, allocation_id: uuid.UUID, *, node_id: uuid.UUID | None = None) -> c.FenceNode:
    saga = uuid.uuid4()
    return c.FenceNode(saga_id=saga, step="fence_node", idempotency_key=step_key(saga, "fence_node"),
                       allocation_id=allocation_id, tenant_id=uuid.uuid4(), node_id=node_id or node.id)


# --- any driver: the instance removed, the records forgotten ---------------------------------------------------
async def test_a_fence_removes_the_instance_and_forgets_it_and_an_absent_one_is_fenced_already(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    cmd = await provisioned(node, records)
    reply = await handlers.fence_step(records, fence_cmd(node, cmd.allocation_id), node=node)
    assert (reply["node_id"], reply["power_state"]) == (node.id, "off") and reply["seconds"] >= 0
    assert await node.driver.list_instances() == [] and records.kept == {}     # no reconcile makes it again
    again = await handlers.fence_step(records, fence_cmd(node, cmd.allocation_id), node=node)
    assert again["power_state"] == "off"


async def test_a_fence_for_another_node_is_refused_before_anything_is_locked(tmp_path):
    records = FakeNodeRecords()
    node = sim_node(tmp_path, records=records)
    other = fence_cmd(node, uuid.uuid4(), node_id=uuid.uuid4())
    with pytest.raises(PermanentError, match="arrived at node"):
        await handlers.fence_node(FakeUnitOfWork("node_agent", "node_agent.fence_node", other), other, node=node)
    assert records.locks == []


# --- bare metal: ForceOff, the power state read back until Off -------------------------------------------------
class FakeBmc:
    """sushy's client as the driver uses it: a server that goes Off ``lag`` reads after a ForceOff (never, when
    ``lag`` is None). ``calls`` lists every call, across the connections the driver opens."""

    calls: list[str] = []
    state = "On"
    lag: int | None = 1

    def __init__(self, _config, _counter=None, **_kw):
        self.changed = False
        self._left: int | None = None

    def power_state(self) -> str:
        FakeBmc.calls.append("power_state")
        if self._left is not None:
            self._left -= 1
            if self._left <= 0:
                FakeBmc.state = "Off"
        return FakeBmc.state

    def reset(self, reset_type: str) -> None:
        FakeBmc.calls.append(reset_type)
        self.changed = True
        self._left = FakeBmc.lag if FakeBmc.lag is not None else None
        if FakeBmc.lag is not None and FakeBmc.lag <= 0:
            FakeBmc.state = "Off"

    def eject_cd(self) -> None:
        FakeBmc.calls.append("eject_cd")

    def close(self) -> None:
        pass


@pytest.fixture
def bmc(monkeypatch):
    monkeypatch.setattr(redfish, "BmcClient", FakeBmc)
    FakeBmc.calls, FakeBmc.state, FakeBmc.lag = [], "On", 1
    return FakeBmc


def bare_metal_node(tmp_path, records: FakeNodeRecords, *, power_off_s: float = 5):
    config = RedfishConfig.from_env({"TESSERA_REDFISH_STATE_DIR": str(tmp_path), "TESSERA_REDFISH_POLL_S": "0.01",
                                     "TESSERA_REDFISH_SERVER_ADDRESS": "172.30.9.10/24",
                                     "TESSERA_REDFISH_TIMEOUTS": f"power_off={power_off_s}"})

    async def source():
        return BmcConfig("https://bmc.example", "1", "admin", "secret")
    driver = redfish.RedfishDriver(config, bmc_source=source)
    return sim_node(tmp_path, records=records, driver=driver), driver


def ran_here(driver: redfish.RedfishDriver, allocation_id: uuid.UUID) -> None:
    driver.records.save({"allocation_id": str(allocation_id), "instance_id": instance_id(allocation_id),
                         "slots": [0], "status": "ready", "token": "t0k3n"})


async def test_a_bare_metal_fence_powers_the_server_off_reads_it_back_and_forgets_the_instance(tmp_path, bmc):
    records = FakeNodeRecords()
    node, driver = bare_metal_node(tmp_path, records)
    allocation = uuid.uuid4()
    ran_here(driver, allocation)
    reply = await handlers.fence_step(records, fence_cmd(node, allocation), node=node)
    assert reply["power_state"] == "off"
    assert bmc.calls[:3] == ["power_state", "ForceOff", "power_state"] and bmc.state == "Off"
    assert "eject_cd" in bmc.calls and driver.records.all() == []


async def test_a_bare_metal_fence_powers_off_even_without_a_record_of_the_allocation(tmp_path, bmc):
    records = FakeNodeRecords()
    node, _driver = bare_metal_node(tmp_path, records)
    await handlers.fence_step(records, fence_cmd(node, uuid.uuid4()), node=node)
    assert "ForceOff" in bmc.calls and bmc.state == "Off"


async def test_a_power_off_not_read_back_in_time_is_refused_and_the_records_are_kept(tmp_path, bmc):
    bmc.lag = None    # the server never says Off
    records = FakeNodeRecords()
    node, driver = bare_metal_node(tmp_path, records, power_off_s=0.1)
    allocation = uuid.uuid4()
    ran_here(driver, allocation)
    with pytest.raises(StepRejected, match="power_off: the server did not power off within 0.1 s"):
        await handlers.fence_step(records, fence_cmd(node, allocation), node=node)
    assert driver.records.get(allocation) is not None      # nothing forgotten: the fence is not confirmed


async def test_a_server_that_runs_another_allocation_is_not_powered_off(tmp_path, bmc):
    records = FakeNodeRecords()
    node, driver = bare_metal_node(tmp_path, records)
    ran_here(driver, uuid.uuid4())
    with pytest.raises(StepRejected, match="runs allocation"):
        await handlers.fence_step(records, fence_cmd(node, uuid.uuid4()), node=node)
    assert bmc.calls == []
