"""The node-agent's instance reconcile with the real libvirt driver, in-process against the suite's NATS and
PostgreSQL: a domain no allocation owns on the node is removed and reported; an allocation whose domain vanished
gets it back from its recorded command, and that is reported too. Nothing foreign is touched (the driver lists
only its node's domains: tests/integration/test_libvirt_driver.py)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from functools import partial

import pytest

from services.node_agent import contracts as c
from services.node_agent.adapters.discovery.sim import discover_sim
from services.node_agent.bootstrap import build
from services.node_agent.domain.vm.domain_xml import domain_name
from tests.support import vm
from tests.support.bus import of
from tests.support.commands import provision_node_cmd
from tests.support.polling import eventually

NODE_NAME = "libvirt-reconcile-test"
pytestmark = [pytest.mark.root, pytest.mark.timeout(300),
              pytest.mark.skipif(os.geteuid() != 0, reason="a system libvirtd needs root")]


@pytest.fixture(scope="module")
async def image():
    return await asyncio.to_thread(vm.host_ready)


@pytest.fixture
async def node(run_service, tmp_path, image):
    node_id = uuid.uuid4()
    driver = vm.driver(tmp_path / "instances", node_id, discover_sim(NODE_NAME))
    environ = {"TESSERA_NODE_RECONCILE_S": "0.5", "TESSERA_NODE_NAME": NODE_NAME, "TESSERA_NODE_DISCOVERY": "sim"}
    rt = await run_service("node_agent", partial(build, driver=driver, environ=environ), instance=str(node_id))
    yield rt, node_id, driver
    # no row left for the reconcile to make an instance again from, then nothing of the node's on the host
    async with rt.pool.acquire() as conn:
        await conn.execute("DELETE FROM instances WHERE node_id=$1", node_id)

    async def remaining() -> list:
        for instance in await driver.list_instances():
            await driver.deprovision(instance.allocation_id)
        return await driver.list_instances()
    await eventually(remaining, until=lambda left: left == [], timeout=60, what=f"node {node_id}'s domains removed")


async def test_a_domain_no_allocation_owns_on_the_node_is_removed_and_reported(node, image, watch):
    rt, node_id, driver = node
    problems = await watch(f"node_agent.evt.instance_problem.{node_id}")
    s = vm.instance_spec(image, node_id, NODE_NAME)
    await driver.provision(s)           # made behind the agent's back: no instance row owns it
    [(_, env, _)] = await problems.wait_for(of(s.allocation_id, "node_agent.instance_problem"), timeout=60)
    assert env["data"]["problem"] == "orphan_removed" and env["data"]["instance_id"] == domain_name(s.allocation_id)
    assert domain_name(s.allocation_id) not in await asyncio.to_thread(vm.domains)


async def test_an_allocation_whose_domain_vanished_gets_it_back_and_it_is_reported(node, image, watch):
    rt, node_id, driver = node
    problems = await watch(f"node_agent.evt.instance_problem.{node_id}")
    s, network = vm.instance_spec(image, node_id, NODE_NAME), uuid.uuid4()
    command = c.ProvisionNode(**provision_node_cmd(node_id, s.allocation_id, uuid.uuid4(), slots=s.slots),
                              slot_details=[{"index": d.index, "gpu_pci": d.gpu_pci, "nvme_pci": d.nvme_pci,
                                             "ib_vf_pci": d.ib_vf_pci, "ib_guid": d.ib_guid, "numa": d.numa,
                                             "nvlink_domain": 0, "cpu_cores": d.cpu_cores, "memory_gb": d.memory_gb}
                                            for d in s.resources],
                              guest={"image": {"image_id": uuid.uuid4(), "name": s.guest.image.name, "os": "busybox",
                                               "format": s.guest.image.format, "source": s.guest.image.source,
                                               "sha256": s.guest.image.sha256, "kernel": s.guest.image.kernel,
                                               "initrd": s.guest.image.initrd, "kernel_args": s.guest.image.kernel_args},
                                     "hostname": s.guest.hostname, "ssh_keys": list(s.guest.ssh_keys)},
                              attachment={"attachment_id": uuid.uuid4(), "allocation_id": s.allocation_id,
                                          "network_id": network, "ip_address": s.nic.ip_address, "prefix_len": 24,
                                          "mac_address": s.nic.mac},
                              tenant_networks={"tenant_id": uuid.uuid4(), "version": 1, "networks": [{
                                  "network_id": network, "name": "default", "vni": 4242, "cidr": "10.77.0.0/24",
                                  "gateway_ip": "10.77.0.1", "vrf_table": 1, "rules": []}]})
    name = domain_name(s.allocation_id)
    async with rt.pool.acquire() as conn:
        # held as a command would hold it: the reconcile leaves the allocation alone until the scene is set
        await conn.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", f"node_agent:{node_id}:{s.allocation_id}")
        try:
            # the instance as a provision left it: the domain and its row (with the command it was made from)
            await driver.provision(s)
            await conn.execute("INSERT INTO instances (node_id, allocation_id, instance_id, slots, command) "
                               "VALUES ($1, $2, $3, $4, $5::jsonb)", node_id, s.allocation_id, name, list(s.slots),
                               command.model_dump_json())
            for verb in ("destroy", "undefine"):   # someone (or a host reboot) takes the domain away
                await asyncio.to_thread(subprocess.run, ["virsh", "-c", vm.URI, verb, name], check=True,
                                        capture_output=True)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))",
                               f"node_agent:{node_id}:{s.allocation_id}")
    [(_, env, _)] = await problems.wait_for(of(s.allocation_id, "node_agent.instance_problem"), timeout=120)
    assert env["data"]["problem"] == "instance_restarted", env["data"]
    assert name in await asyncio.to_thread(vm.domains)
    assert (await driver.instance_info(s.allocation_id))["power_state"] == "running"
    await eventually(lambda: driver.console(s.allocation_id, 0, 1 << 20), until=lambda ch: "TESSERA-READY" in ch.text,
                     timeout=10, what="the remade guest's ready line")
