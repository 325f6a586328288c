"""The redfish driver against a real BMC emulator: sushy-emulator (HTTP basic auth) in front of a "server" that is
a real QEMU domain (TCG, BIOS) on its own provisioning bridge, with a loop device for its NVMe. The server boots
the project's guest image from the allocation's virtual-media ISO and phones home to the driver.

The lab (domain, storage pool, bridge, loop devices, emulator) is made once for the module and removed after it,
also when a test fails. Settings and the media server's refusals are checked without root.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid

import aiohttp
import pytest

from services.node_agent import contracts as c
from services.node_agent.adapters.drivers import DRIVERS, DriverConfigError, DriverError
from services.node_agent.adapters.drivers.redfish.bmc import BmcConfig, BmcError
from services.node_agent.adapters.drivers.redfish.bmc import validate as validate_bmc
from services.node_agent.adapters.drivers.redfish.config import DEFAULT_TIMEOUTS, RedfishConfig
from services.node_agent.adapters.drivers.redfish.driver import RedfishDriver
from services.node_agent.adapters.drivers.redfish.media import MediaServer
from services.node_agent.domain.model import GuestConfig, InstanceSpec, NicConfig
from tests.support import vm
from tests.support.bmc import free_port
from tests.support.guest import GuestShell
from tests.support.polling import eventually

PHASES = ["power_off", "insert_media", "boot_override", "power_on", "deploy"]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDk test@tessera"
# the allocation's tenant interface (its port and MAC are the dataplane's: a server keeps its own NIC)
TENANT_NIC = NicConfig("ts-port", "02:00:00:00:00:10", "10.77.0.5", 24, "10.77.0.1")


def on_lab(test):
    """A test against the lab: root (a system libvirtd, a bridge, loop devices), bounded."""
    for mark in (pytest.mark.root, pytest.mark.timeout(300),
                 pytest.mark.skipif(os.geteuid() != 0, reason="a system libvirtd, a bridge and loop devices need root")):
        test = mark(test)
    return test


@pytest.fixture(scope="module", autouse=True)
async def clean_streams():
    """No bus here (the package's fixture would purge the streams)."""
    yield


@pytest.fixture(scope="module")
async def image():
    return await asyncio.to_thread(vm.host_ready)


@pytest.fixture(scope="module")
async def lab(image):
    from tests.support.bmc import BmcLab
    started = BmcLab()
    await asyncio.to_thread(started.start)
    try:
        yield started
    finally:
        await asyncio.to_thread(started.stop)


def make_driver(lab, state_dir, *, password: str | None = None, bmc_source=None, **env) -> RedfishDriver:
    config = RedfishConfig.from_env({"TESSERA_REDFISH_STATE_DIR": str(state_dir),
                                     "TESSERA_REDFISH_MEDIA_LISTEN": f"{lab.host_address}:0",
                                     "TESSERA_REDFISH_SERVER_ADDRESS": lab.server_address,
                                     "TESSERA_REDFISH_POLL_S": "0.2", **env})

    async def bmc():
        return lab.bmc_config(password)
    return RedfishDriver(config, bmc_source=bmc_source or bmc)


def spec_for(image, nic: NicConfig | None = None) -> InstanceSpec:
    allocation = uuid.uuid4()
    return InstanceSpec(allocation, uuid.uuid4(), uuid.uuid4(), (0,), nic=nic,
                        guest=GuestConfig(vm.boot_image(image), f"bm-{allocation.hex[:6]}", (KEY,)))


def resets(lab) -> int:
    """ComputerSystem.Reset requests the emulator has served so far."""
    return lab.emulator.log_tail(100000).count("/Actions/ComputerSystem.Reset")


@pytest.fixture(scope="module")
async def provisioned(lab, image, tmp_path_factory):
    """(driver, spec, instance id) of one allocation with a tenant interface provisioned on the lab's server (its
    tenant address primary, its provisioning address beside it); deprovisioned at the end."""
    driver = make_driver(lab, tmp_path_factory.mktemp("redfish"), TESSERA_REDFISH_SWITCH_PORT="leaf-lab/swp1",
                         TESSERA_REDFISH_HCA_GUIDS="0x0002c903000e0b72")
    spec = spec_for(image, TENANT_NIC)
    try:
        instance_id = await driver.provision(spec)
        yield driver, spec, instance_id
    finally:
        try:
            await driver.deprovision(spec.allocation_id)
        finally:
            await driver.close()


# -- settings and the media server, no lab --------------------------------------------------------------------
def test_settings_are_read_and_refused_naming_the_variable(tmp_path):
    base = {"TESSERA_REDFISH_SERVER_ADDRESS": "172.30.9.10/24"}
    config = RedfishConfig.from_env({**base, "TESSERA_REDFISH_TIMEOUTS": "deploy=5, power_on=7.5"})
    assert config.timeouts == {**DEFAULT_TIMEOUTS, "deploy": 5.0, "power_on": 7.5}
    assert config.media_listen == ("127.0.0.1", 0) and config.poll_s == 0.5 and config.server_mac is None
    assert isinstance(DRIVERS["redfish"].from_env(base), RedfishDriver)
    for env, var in [({"TESSERA_REDFISH_SERVER_ADDRESS": ""}, "TESSERA_REDFISH_SERVER_ADDRESS"),
                     ({"TESSERA_REDFISH_SERVER_ADDRESS": "172.30.9.10"}, "TESSERA_REDFISH_SERVER_ADDRESS"),
                     ({"TESSERA_REDFISH_TIMEOUTS": "deploy=0"}, "TESSERA_REDFISH_TIMEOUTS"),
                     ({"TESSERA_REDFISH_TIMEOUTS": "boot=5"}, "TESSERA_REDFISH_TIMEOUTS"),
                     ({"TESSERA_REDFISH_MEDIA_LISTEN": "nohost"}, "TESSERA_REDFISH_MEDIA_LISTEN"),
                     ({"TESSERA_REDFISH_MEDIA_LISTEN": "0.0.0.0:8080"}, "TESSERA_REDFISH_MEDIA_URL"),
                     ({"TESSERA_REDFISH_MEDIA_URL": "ftp://x/"}, "TESSERA_REDFISH_MEDIA_URL"),
                     ({"TESSERA_REDFISH_SERVER_GATEWAY": "10.0.0.1"}, "TESSERA_REDFISH_SERVER_GATEWAY"),
                     ({"TESSERA_REDFISH_SERVER_MAC": "52:54:00"}, "TESSERA_REDFISH_SERVER_MAC"),
                     ({"TESSERA_REDFISH_POLL_S": "-1"}, "TESSERA_REDFISH_POLL_S")]:
        with pytest.raises(DriverConfigError, match=var):
            RedfishConfig.from_env({**base, **env})


def test_a_bmc_config_never_shows_its_password():
    bmc = BmcConfig("https://10.0.0.9", "/redfish/v1/Systems/1", "admin", "s3cret-pw", ca_bundle="-----BEGIN")
    assert "s3cret-pw" not in repr(bmc) and "s3cret-pw" not in str(bmc) and "'***'" in repr(bmc)


async def test_the_media_server_knows_only_its_tokens(tmp_path):
    server = MediaServer(("127.0.0.1", 0))
    base = await server.start()
    try:
        (tmp_path / "a.iso").write_bytes(b"iso")
        token = "t" * 32
        iso_url, phone_home = server.offer(token, tmp_path / "a.iso")
        async with aiohttp.ClientSession() as http:
            async with http.get(iso_url) as rsp:
                assert rsp.status == 200 and await rsp.read() == b"iso"
            for url in (f"{base}/media/{'u' * 32}.iso", f"{base}/media/{token}", f"{base}/media/../a.iso"):
                async with http.get(url) as rsp:
                    assert rsp.status == 404, url
            async with http.post(f"{base}/phone-home/{'u' * 32}", data={"instance_id": "x"}) as rsp:
                assert rsp.status == 404
            async with http.post(phone_home, data={"instance_id": "bm-1", "hostname": "h", "ip": "10.0.0.2"}) as rsp:
                assert rsp.status == 200
        report = await asyncio.wait_for(server.wait_phone_home(token), 5)
        assert (report.instance_id, report.hostname, report.ip) == ("bm-1", "h", "10.0.0.2")
        server.withdraw(token)
        assert not (tmp_path / "a.iso").exists()
    finally:
        await server.close()


# -- against the lab ------------------------------------------------------------------------------------------
@on_lab
async def test_validate_reports_the_system_and_refuses_a_wrong_password(lab, tmp_path):
    driver = make_driver(lab, tmp_path)
    report = await driver.validate(lab.bmc_config())
    assert report["power_state"] == "Off" and report["manufacturer"] == "Sushy Emulator"
    assert report["system_id"] == lab.server_system_id
    assert "model" in report and "serial" in report   # sushy-emulator reports neither (None)
    with pytest.raises(BmcError, match="HTTP 401 Unauthorized") as refused:
        await driver.validate(lab.bmc_config(password="wrong"))
    assert refused.value.kind == "unauthorized"


async def failed_provision(driver: RedfishDriver, image, match: str) -> InstanceSpec:
    """Provision on ``driver`` expecting the DriverError ``match`` names, then close the driver; the spec."""
    spec = spec_for(image)
    try:
        with pytest.raises(DriverError, match=match):
            await driver.provision(spec)
    finally:
        await driver.close()
    return spec


@on_lab
async def test_a_wrong_bmc_password_fails_provisioning_at_power_off_and_leaves_the_server_off(lab, image, tmp_path):
    driver = make_driver(lab, tmp_path, password="wrong")
    spec = await failed_provision(driver, image, r"^power_off: the BMC refused the credentials: HTTP 401 Unauthorized")
    assert not await asyncio.to_thread(lab.running)
    assert await driver.list_instances() == [] and await driver.instance_of(spec.allocation_id) is None


@on_lab
async def test_a_power_on_that_does_not_take_effect_in_time_fails_naming_the_phase_and_is_undone(lab, image, tmp_path):
    """The server takes longer to power on than the phase allows (a QEMU start takes ~0.5 s): the step fails
    naming power_on; the compensation lets the abandoned request land, then powers the server off and ejects."""
    driver = make_driver(lab, tmp_path, TESSERA_REDFISH_TIMEOUTS="power_on=0.05")
    await failed_provision(driver, image, r"^power_on: the server did not power on within 0.05 s")
    assert not await asyncio.to_thread(lab.running)
    assert await asyncio.to_thread(lab.cdrom_sources) == []
    assert await driver.list_instances() == []


@on_lab
async def test_an_unreachable_bmc_fails_at_the_first_phase_and_leaves_no_record(lab, image, tmp_path):
    closed = BmcConfig(f"http://127.0.0.1:{free_port()}", lab.server_system_id, "admin", "pw", verify_tls=False)

    async def unreachable():
        return closed
    driver = make_driver(lab, tmp_path, bmc_source=unreachable)
    await failed_provision(driver, image, r"^power_off: the BMC is unreachable .*Connection refused")
    assert await driver.list_instances() == [] and not await asyncio.to_thread(lab.running)
    with pytest.raises(BmcError) as caught:
        await asyncio.to_thread(validate_bmc, closed)
    assert caught.value.kind == "unreachable"


@on_lab
async def test_a_server_that_never_reports_ready_fails_at_deploy_and_is_left_off_without_media(lab, image, tmp_path):
    driver = make_driver(lab, tmp_path, TESSERA_REDFISH_TIMEOUTS="deploy=2")
    await failed_provision(driver, image, r"^deploy: the server did not report ready within 2 s$")
    assert not await asyncio.to_thread(lab.running)
    assert await asyncio.to_thread(lab.cdrom_sources) == []
    assert await driver.list_instances() == []
    assert list((tmp_path / "media").glob("*.iso")) == []


@on_lab
async def test_provisioning_boots_the_image_from_virtual_media_and_the_server_phones_home(lab, provisioned):
    driver, spec, instance_id = provisioned
    assert instance_id == f"bm-{spec.allocation_id}"
    assert await asyncio.to_thread(lab.running)
    ready = [line for line in lab.console().splitlines() if f"TESSERA-READY instance={instance_id} " in line]
    # the tenant address is the primary; the phone-home still came over the provisioning address (on-link)
    assert ready and f"hostname={spec.guest.hostname}" in ready[0] and "ip=10.77.0.5/24 " in ready[0]
    assert f"mac={lab.server_mac}" in ready[0]
    record = driver.records.get(spec.allocation_id)
    assert record["status"] == "ready" and record["address"] == "10.77.0.5"   # phoned home
    with GuestShell(lab.shell_socket) as shell:   # the server's OS holds both addresses, the tenant's first
        status, out = await shell.arun("ip addr show dev eth0; ip route")
    assert status == 0, out
    assert out.index("inet 10.77.0.5/24") < out.index(f"inet {lab.server_address}") and "mtu 1450" in out
    assert "default via 10.77.0.1" in out
    info = await driver.instance_info(spec.allocation_id)
    assert [p["name"] for p in info["phases"]] == PHASES and all(p["seconds"] >= 0 for p in info["phases"])
    assert info["redfish_calls"] > 0 and info["power_state"] == "running" and info["passthrough"] == "real"
    assert info["hostname"] == spec.guest.hostname and info["booted_at"] and info["boot_s"] > 0
    assert info["addresses"] == ["10.77.0.5/24"] and info["network_phase"] == "provisioning"
    assert info["switch_port"] == {"leaf": "leaf-lab", "port": "swp1"} and info["hca_guids"] == ["0x0002c903000e0b72"]
    c.InstanceInfo(instance_id=instance_id, driver="redfish", dataplane="none", node_id=spec.node_id, **info)
    print("\nphases:", ", ".join(f"{p['name']} {p['seconds']:.2f}s" for p in info["phases"]),
          f"| {info['redfish_calls']} Redfish calls")
    [listed] = await driver.list_instances()
    assert (listed.allocation_id, listed.instance_id, listed.slots) == (spec.allocation_id, instance_id, (0,))
    # again: the same instance, nothing asked of the BMC
    before = resets(lab)
    assert await driver.provision(spec) == instance_id
    assert resets(lab) == before
    assert (await driver.instance_info(spec.allocation_id))["redfish_calls"] == info["redfish_calls"]
    # the server is the node's only instance
    with pytest.raises(DriverError, match="already runs allocation"):
        await driver.provision(dataclasses.replace(spec, allocation_id=uuid.uuid4()))


@on_lab
async def test_power_actions_go_through_the_bmc(lab, provisioned):
    driver, spec, _ = provisioned
    assert await driver.power(spec.allocation_id, "stop") == "stopped"
    assert not await asyncio.to_thread(lab.running)
    assert (await driver.instance_info(spec.allocation_id))["power_state"] == "stopped"
    assert await driver.power(spec.allocation_id, "stop") == "stopped"     # idempotent
    booted = lab.console().count("TESSERA-READY")
    assert await driver.power(spec.allocation_id, "start") == "running"
    assert await asyncio.to_thread(lab.running)
    before = resets(lab)
    assert await driver.power(spec.allocation_id, "reboot") == "running"
    assert resets(lab) == before + 1 and await asyncio.to_thread(lab.running)
    # the server boots its image from the media again (the boot override is set again before each start)
    await eventually(lambda: lab.console().count("TESSERA-READY"), until=lambda n: n > booted, timeout=90,
                     what="the guest's ready line after the restart")
    with pytest.raises(DriverError, match="no instance"):
        await driver.power(uuid.uuid4(), "start")


@on_lab
async def test_deprovision_powers_off_ejects_and_forgets_and_is_idempotent(lab, provisioned):
    driver, spec, _ = provisioned
    await driver.deprovision(spec.allocation_id)
    assert not await asyncio.to_thread(lab.running)
    assert await asyncio.to_thread(lab.cdrom_sources) == []
    assert driver.records.get(spec.allocation_id) is None
    assert await driver.list_instances() == [] and await driver.instance_of(spec.allocation_id) is None
    assert list(driver.config.media_dir.glob("*.iso")) == []
    served = lab.emulator.log_tail(100000).count("HTTP/1.1")
    await driver.deprovision(spec.allocation_id)    # nothing left: not even a call to the BMC
    assert lab.emulator.log_tail(100000).count("HTTP/1.1") == served


# -- the fence of a move ----------------------------------------------------------------------------------------
@on_lab
async def test_a_fence_powers_the_running_server_off_confirms_it_and_forgets_the_allocation(lab, tmp_path):
    """The old server of a moved allocation: ForceOff, read back as Off, the record forgotten. An unreachable BMC
    is no fence: it fails naming the phase and the record stays."""
    from services.node_agent.adapters.drivers.redfish.bmc import BmcClient
    from services.node_agent.adapters.drivers.redfish.records import instance_id

    with BmcClient(lab.bmc_config()) as client:
        await asyncio.to_thread(client.reset, "On")
    await eventually(lambda: asyncio.to_thread(lab.running), timeout=30, what="the server running")
    allocation = uuid.uuid4()
    closed = BmcConfig(f"http://127.0.0.1:{free_port()}", lab.server_system_id, "admin", "pw", verify_tls=False)

    async def unreachable():
        return closed
    cut_off = make_driver(lab, tmp_path / "cut-off", bmc_source=unreachable)
    cut_off.records.save({"allocation_id": str(allocation), "instance_id": instance_id(allocation), "slots": [0],
                          "status": "ready"})
    with pytest.raises(DriverError, match="^power_off: "):
        await cut_off.fence(allocation)
    assert cut_off.records.get(allocation) is not None and await asyncio.to_thread(lab.running)

    driver = make_driver(lab, tmp_path / "fence")
    driver.records.save({"allocation_id": str(allocation), "instance_id": instance_id(allocation), "slots": [0],
                         "status": "ready"})
    try:
        await driver.fence(allocation)
        assert not await asyncio.to_thread(lab.running)
        assert driver.records.get(allocation) is None and await driver.list_instances() == []
    finally:
        await driver.close()
