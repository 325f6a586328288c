"""The contract every provisioning driver keeps, run against every in-memory entry of DRIVERS (no I/O); the
libvirt driver keeps it against a real libvirtd in tests/integration/test_libvirt_driver.py."""
from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

import pytest

from services.node_agent.adapters.drivers import DRIVERS, DriverConfigError, DriverError, ProvisioningDriver, SimDriver
from services.node_agent.domain.model import InstanceSpec, NicConfig


def spec(allocation: uuid.UUID | None = None, slots: tuple[int, ...] = (0, 1)) -> InstanceSpec:
    return InstanceSpec(allocation or uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), slots)


@pytest.fixture(params=sorted(name for name, cls in DRIVERS.items() if not cls.persistent))
def driver(request) -> ProvisioningDriver:
    return DRIVERS[request.param].from_env({})


async def instances_of(driver: ProvisioningDriver, allocation: uuid.UUID) -> list:
    return [i for i in await driver.list_instances() if i.allocation_id == allocation]


async def test_provisioned_instance_is_listed_with_its_allocation_and_slots(driver):
    s = spec(slots=(2, 3))
    instance_id = await driver.provision(s)
    assert isinstance(instance_id, str) and instance_id
    [listed] = await instances_of(driver, s.allocation_id)
    assert (listed.instance_id, listed.slots) == (instance_id, (2, 3))


async def test_provisioning_an_allocation_twice_returns_the_same_single_instance(driver):
    s = spec()
    first = await driver.provision(s)
    assert await driver.provision(s) == first
    assert len(await instances_of(driver, s.allocation_id)) == 1


async def test_racing_provisions_of_one_allocation_create_one_instance(driver):
    s = spec()
    ids = await asyncio.gather(*(driver.provision(s) for _ in range(5)))
    assert len(set(ids)) == 1
    assert len(await instances_of(driver, s.allocation_id)) == 1


async def test_distinct_allocations_get_distinct_instances(driver):
    a, b = await driver.provision(spec()), await driver.provision(spec())
    assert a != b


async def test_deprovision_removes_the_instance_and_is_idempotent(driver):
    s = spec()
    await driver.provision(s)
    await driver.deprovision(s.allocation_id)
    assert await instances_of(driver, s.allocation_id) == []
    await driver.deprovision(s.allocation_id)
    assert await instances_of(driver, s.allocation_id) == []


async def test_deprovision_of_an_allocation_never_provisioned_is_a_harmless_no_op(driver):
    other = spec()
    await driver.provision(other)
    await driver.deprovision(uuid.uuid4())
    assert len(await instances_of(driver, other.allocation_id)) == 1


async def test_allocation_can_be_provisioned_again_after_deprovision(driver):
    s = spec()
    await driver.provision(s)
    await driver.deprovision(s.allocation_id)
    again = await driver.provision(s)
    [listed] = await instances_of(driver, s.allocation_id)
    assert listed.instance_id == again


# --- the sim driver's own knobs -------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["provision", "deprovision", "list_instances"])
async def test_sim_injected_failure_raises_driver_error_naming_the_operation(op):
    driver = SimDriver(fail=[op])
    call = {"provision": lambda: driver.provision(spec()), "deprovision": lambda: driver.deprovision(uuid.uuid4()),
            "list_instances": driver.list_instances}[op]
    with pytest.raises(DriverError, match=f"injected failure of {op}"):
        await call()


async def test_sim_failed_provision_leaves_no_instance():
    driver = SimDriver(fail=["provision"])
    with pytest.raises(DriverError):
        await driver.provision(spec())
    assert await driver.list_instances() == []


async def test_sim_failed_deprovision_keeps_the_instance():
    driver = SimDriver()
    s = spec()
    await driver.provision(s)
    driver.fail = frozenset({"deprovision"})
    with pytest.raises(DriverError):
        await driver.deprovision(s.allocation_id)
    assert len(await instances_of(driver, s.allocation_id)) == 1


async def test_sim_latency_delays_only_the_operations_it_names():
    driver = SimDriver({"provision": 0.05})
    started = time.monotonic()
    await driver.provision(spec())
    assert time.monotonic() - started >= 0.05
    assert driver.latency["deprovision"] == 0.0


def test_sim_reads_latency_and_failures_from_the_environment_a_bare_latency_sparing_listing():
    driver = SimDriver.from_env({"TESSERA_SIM_LATENCY_S": "1.5", "TESSERA_SIM_FAIL": "provision, deprovision"})
    assert driver.latency == {"provision": 1.5, "deprovision": 1.5, "list_instances": 0.0}
    assert driver.fail == {"provision", "deprovision"}
    per_op = SimDriver.from_env({"TESSERA_SIM_LATENCY_S": "provision=3,list_instances=0.5"})
    assert per_op.latency == {"provision": 3.0, "deprovision": 0.0, "list_instances": 0.5}


def test_sim_defaults_to_no_latency_and_no_failures():
    driver = SimDriver.from_env({})
    assert set(driver.latency.values()) == {0.0} and driver.fail == frozenset()


@pytest.mark.parametrize("env, message", [
    ({"TESSERA_SIM_LATENCY_S": "slow"}, "TESSERA_SIM_LATENCY_S"),
    ({"TESSERA_SIM_LATENCY_S": "provision=3,deprovision"}, "TESSERA_SIM_LATENCY_S"),
    ({"TESSERA_SIM_LATENCY_S": "boot=3"}, "unknown operation"),
    ({"TESSERA_SIM_LATENCY_S": "-1"}, "negative"),
    ({"TESSERA_SIM_FAIL": "provision,reboot"}, "TESSERA_SIM_FAIL"),
])
def test_sim_rejects_bad_configuration_with_a_clear_error(env, message):
    with pytest.raises(DriverConfigError, match=message):
        SimDriver.from_env(env)


async def test_a_sim_instance_reports_its_tenant_address_like_a_vms():
    driver = SimDriver()
    nic = NicConfig("ts-port", "02:00:00:00:00:10", "10.8.0.5", 24, "10.8.0.1")
    with_nic, without = dataclasses.replace(spec(), nic=nic), spec()
    await driver.provision(with_nic)
    await driver.provision(without)
    assert (await driver.instance_info(with_nic.allocation_id))["addresses"] == ["10.8.0.5/24"]
    assert (await driver.instance_info(without.allocation_id))["addresses"] == []
    await driver.deprovision(with_nic.allocation_id)
    assert "addresses" not in await driver.instance_info(with_nic.allocation_id)
