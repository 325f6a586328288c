"""The libvirt driver against a real libvirtd and QEMU (TCG): the driver contract, the guest's first boot from
the project's image with its NoCloud seed, power actions, the console, and every failure leaving nothing behind.

No dataplane here: the guest's tap stays unplugged (the e2e tests plug it into tenant networks)."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid

import pytest

from services.node_agent.adapters.discovery.sim import discover_sim
from services.node_agent.adapters.drivers import DriverError
from services.node_agent.domain.model import InstanceSpec
from services.node_agent.domain.vm.domain_xml import domain_name, parse_metadata
from tests.support import vm

pytestmark = [pytest.mark.root, pytest.mark.timeout(600),
              pytest.mark.skipif(os.geteuid() != 0, reason="a system libvirtd needs root")]

NODE_NAME = "libvirt-driver-test"


@pytest.fixture(scope="module", autouse=True)
async def clean_streams():
    """No bus here (the package's fixture would purge the streams)."""
    yield


@pytest.fixture(scope="module")
async def image():
    return await asyncio.to_thread(vm.host_ready)


@pytest.fixture
def node_id():
    return uuid.uuid4()


@pytest.fixture
def driver(tmp_path, node_id):
    return vm.driver(tmp_path / "instances", node_id, discover_sim(NODE_NAME))


def spec(image, node_id, *, slots=(0,), ip="10.77.0.5", **image_changes) -> InstanceSpec:
    return vm.instance_spec(image, node_id, NODE_NAME, slots=slots, ip=ip, **image_changes)


async def test_an_instance_boots_from_the_image_and_reports_ready_with_its_seed(driver, image, node_id, tmp_path):
    s = spec(image, node_id)
    try:
        instance_id = await driver.provision(s)
        assert instance_id == domain_name(s.allocation_id)
        [listed] = [i for i in await driver.list_instances() if i.allocation_id == s.allocation_id]
        assert listed.slots == (0,)
        info = await driver.instance_info(s.allocation_id)
        assert info["passthrough"] == "simulated" and info["power_state"] == "running"
        assert info["hostname"] == s.guest.hostname and 0 < info["boot_s"] < 120
        assert info["addresses"] == ["10.77.0.5/24"]
        console = await driver.console(s.allocation_id, -1, 65536)
        ready = next(line for line in console.text.splitlines() if "TESSERA-READY" in line)
        assert f"hostname={s.guest.hostname}" in ready and "ip=10.77.0.5/24" in ready and f"mac={s.nic.mac}" in ready
        # the started domain is Tessera's and this node's; the full XML (written beside it) keeps the hostdevs
        files = tmp_path / "instances" / instance_id
        assert parse_metadata((files / "domain.xml").read_text())["node_id"] == str(node_id)
        assert "<hostdev" in (files / "domain-full.xml").read_text()
        assert "<hostdev" not in (files / "domain.xml").read_text()
        # provisioning again is idempotent: the same instance, nothing new
        assert await driver.provision(s) == instance_id
    finally:
        await driver.deprovision(s.allocation_id)
    assert await asyncio.to_thread(vm.leftovers, s.allocation_id, tmp_path / "instances") == []
    await driver.deprovision(s.allocation_id)   # idempotent


async def test_power_actions_stop_start_and_reboot_the_guest(driver, image, node_id, tmp_path):
    s = spec(image, node_id)
    try:
        await driver.provision(s)
        assert await driver.power(s.allocation_id, "stop") == "stopped"
        assert (await driver.instance_info(s.allocation_id))["power_state"] == "stopped"
        assert await driver.power(s.allocation_id, "stop") == "stopped"   # idempotent
        assert await driver.power(s.allocation_id, "start") == "running"
        assert await driver.power(s.allocation_id, "reboot") == "running"
        console = await driver.console(s.allocation_id, 0, 1 << 20)
        assert console.text.count("TESSERA-READY") >= 1 and console.running
    finally:
        await driver.deprovision(s.allocation_id)
    with pytest.raises(DriverError, match="no instance"):
        await driver.power(s.allocation_id, "start")
    assert await driver.console(s.allocation_id, -1, 100) is None


async def test_an_image_whose_checksum_does_not_match_fails_naming_it_and_leaves_nothing(driver, image, node_id, tmp_path):
    s = spec(image, node_id, sha256="0" * 64, name="tampered")
    with pytest.raises(DriverError, match="image tampered: checksum mismatch"):
        await driver.provision(s)
    assert await asyncio.to_thread(vm.leftovers, s.allocation_id, tmp_path / "instances") == []
    assert not list((tmp_path / "instances" / "images").glob(f"{'0' * 64}*"))


async def test_a_guest_that_never_reports_ready_fails_with_its_console_and_leaves_nothing(image, node_id, tmp_path):
    impatient = vm.driver(tmp_path / "instances", node_id, discover_sim(NODE_NAME), boot_timeout_s=0.5)
    s = spec(image, node_id)
    with pytest.raises(DriverError, match=r"did not report ready within 0.5 s; console:"):
        await impatient.provision(s)
    assert await asyncio.to_thread(vm.leftovers, s.allocation_id, tmp_path / "instances") == []


async def test_an_unreachable_libvirt_is_a_clear_error_and_deprovision_of_nothing_still_succeeds(image, node_id, tmp_path):
    gone = vm.driver(tmp_path / "instances", node_id, discover_sim(NODE_NAME))
    gone.config = gone.config.__class__(**{**gone.config.__dict__, "uri": "qemu+unix:///system?socket=/nonexistent/sock"})
    s = spec(image, node_id)
    with pytest.raises(DriverError, match="libvirt at qemu.unix:///system.socket=/nonexistent/sock is unreachable"):
        await gone.provision(s)
    await gone.deprovision(s.allocation_id)   # nothing was made: the compensation succeeds without libvirt
    assert not (tmp_path / "instances" / domain_name(s.allocation_id)).exists()


async def test_domains_of_other_nodes_and_foreign_domains_are_never_listed(driver, image, node_id, tmp_path):
    other = vm.driver(tmp_path / "other", uuid.uuid4(), discover_sim(NODE_NAME))
    s = spec(image, other.node_id)
    try:
        await other.provision(s)
        assert s.allocation_id not in {i.allocation_id for i in await driver.list_instances()}
        assert s.allocation_id in {i.allocation_id for i in await other.list_instances()}
        await driver.deprovision(s.allocation_id)   # not this node's: left alone
        assert domain_name(s.allocation_id) in await asyncio.to_thread(vm.domains)
    finally:
        await other.deprovision(s.allocation_id)


async def test_one_allocation_runs_on_two_nodes_of_one_libvirtd_apart_when_each_names_its_domains(image, tmp_path):
    """A lab's nodes share one libvirtd: with a name suffix each, an allocation moved from one to the other (a
    reschedule) gets a domain of its own there while the old one still runs, and removing the old one leaves the
    new one running."""
    old = vm.driver(tmp_path / "instances", uuid.uuid4(), discover_sim(NODE_NAME), name_suffix="n0")
    new = vm.driver(tmp_path / "instances", uuid.uuid4(), discover_sim(f"{NODE_NAME}-b"), name_suffix="n1")
    first = spec(image, old.node_id)
    # the same allocation on the other node: that node's slot and the port of its new network attachment
    other = vm.instance_spec(image, new.node_id, f"{NODE_NAME}-b", ip="10.77.0.6")
    moved = dataclasses.replace(other, allocation_id=first.allocation_id, tenant_id=first.tenant_id)
    try:
        assert await old.provision(first) == f"{domain_name(first.allocation_id)}-n0"
        assert await new.provision(moved) == f"{domain_name(first.allocation_id)}-n1"
        await old.deprovision(first.allocation_id)
        assert [i.instance_id for i in await new.list_instances()] == [f"{domain_name(first.allocation_id)}-n1"]
        assert await asyncio.to_thread(vm.domains) >= {f"{domain_name(first.allocation_id)}-n1"}
    finally:
        await old.deprovision(first.allocation_id)
        await new.deprovision(first.allocation_id)


async def test_a_foreign_domain_is_never_listed_nor_removed(driver, tmp_path):
    """A domain without Tessera's metadata (someone else's on the same host) is invisible to the driver."""
    import libvirt
    name = f"foreign-{uuid.uuid4().hex[:8]}"
    xml = (f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>"
           "<os><type arch='x86_64' machine='pc'>hvm</type></os></domain>")
    conn = libvirt.open(vm.URI)
    dom = conn.defineXML(xml)
    try:
        assert name not in {i.instance_id for i in await driver.list_instances()}
        assert name in await asyncio.to_thread(vm.domains)
    finally:
        dom.undefine()
        conn.close()
