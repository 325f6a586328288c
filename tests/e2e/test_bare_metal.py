"""Bare metal made real: through the gateway, a bare_metal allocation is provisioned by the node's
redfish driver against a real sushy-emulator BMC whose server is a real QEMU domain (TCG); the server boots the
project's image from virtual media and phones home over the provisioning network, then its switch port moves to its
tenant's VXLAN on a Linux leaf, where it reaches the tenant's VM slice and no provisioning service; release powers it
off, returns its port to the provisioning network, ejects the media and wipes its disks (loop devices full of "tenant
data") with evidence; a wrong BMC password fails the step naming the 401 and leaves
the server off; a slot whose wipe fails is quarantined, never placed, and returns after a provider admin's
re-wipe. Nothing is mocked between Tessera and the emulator."""
from __future__ import annotations

import asyncio
import json
import os
import uuid
from datetime import datetime

import asyncpg
import pytest

from services.node_agent.adapters.dataplane.lab import UNDERLAY_DEV, Lab
from tests.support import vm
from tests.support.disks import fill_pattern, pattern_on, set_read_only
from tests.support.guest import GuestShell, http_get
from tests.support.platform import E2E_ENV
from tests.support.polling import eventually
from tooling.bmc_lab import BmcLab
from tooling.client import TesseraClient
from tooling.demo_lab import remove_domains_of
from tooling.leaf_lab import PROVISIONING_VLAN
from tooling.platform import Platform

pytestmark = [pytest.mark.root, pytest.mark.timeout(900),
              pytest.mark.skipif(os.geteuid() != 0, reason="a BMC lab (bridges, loop devices, libvirt) needs root")]

SLOTS = 8                                    # bm.8gpu: the whole HGX node, one NVMe per slot
WIPE_POLICY = "nvme-secure-erase+discard"    # the loop devices are no NVMe controllers: blkdiscard
BOOT_S = 180
PHASES = ["power_off", "insert_media", "boot_override", "power_on", "deploy", "port_to_tenant"]


@pytest.fixture(scope="module")
async def platform(tmp_path_factory):
    """The server cabled to a leaf on the underlay of one VM-slice node (libvirt, kernel dataplane): the network
    service's kernel driver programs the leaf."""
    image = await asyncio.to_thread(vm.host_ready)
    work = tmp_path_factory.mktemp("bm-platform")
    underlay = Lab(1, dataplanes=False)
    lab = BmcLab(disks=SLOTS, fabric=(underlay.fabric, "ul"))
    p = None
    try:
        await asyncio.to_thread(underlay.build)
        await asyncio.to_thread(lab.start)
        p = Platform(work, env={**E2E_ENV, **lab.network_env(),
                                "TESSERA_SAGA_STEP_TIMEOUTS": "provision_node=120,wipe_slots=60"}, durable=False)
        p.lab, p.underlay, p.vm_nodes = lab, underlay, set()
        await p.start()
        env = {**lab.node_env(work / "redfish"), "TESSERA_REDFISH_TIMEOUTS": "deploy=90"}
        async with p.admin() as admin:
            await admin.define_pool("bm", "pack", {"dedicated": "bm:NoSchedule"})
            await admin.define_pool("vm", "pack", {"dedicated": "vm:NoSchedule"})
            p.node = await p.add_node(f"bm-{lab.tag}", env=env, pool="bm", wipe_policy=WIPE_POLICY)
            vm_node = await p.add_node(f"vm-{lab.tag}", pool="vm", env={
                **vm.VM_ENV, "TESSERA_NODE_DATAPLANE": "kernel", "TESSERA_NODE_NETNS": underlay.node_ns[0],
                "TESSERA_NODE_UNDERLAY_DEV": UNDERLAY_DEV, "TESSERA_LIBVIRT_STATE_DIR": str(work / "vm-node")})
            p.vm_nodes.add(vm_node)
            underlay.node_ids = [uuid.UUID(vm_node)]
            status, body, _ = await admin.request("POST", "/v1/images", json_body=vm.catalog_entry(image, default=True))
            assert status == 201, body
            await set_bmc(admin, p, lab.password)
        p.opts = {"pool": "bm", "tolerations": ["dedicated=bm:NoSchedule"]}
        yield p
    finally:
        try:
            if p is not None:
                await p.stop()
        finally:
            await asyncio.to_thread(remove_domains_of, getattr(p, "vm_nodes", set()))
            await asyncio.to_thread(lab.stop)
            await asyncio.to_thread(underlay.destroy)


async def set_bmc(admin: TesseraClient, p: Platform, password: str) -> dict:
    status, body, _ = await admin.request("PUT", f"/v1/nodes/{p.node}/bmc", json_body=p.lab.bmc_body(password))
    assert status == 200, body
    return body


async def tenant(p: Platform, admin: TesseraClient) -> TesseraClient:
    t = await admin.create_tenant(f"bm-{uuid.uuid4().hex[:8]}")
    await admin.set_quota(t["id"], "bm", "H100", 16)
    await admin.set_quota(t["id"], "vm", "H100", 8)
    u = await admin.create_user(t["id"], "researcher", "tenant_user")
    return await TesseraClient(p.gateway_url, u["api_key"]).__aenter__()


async def server(p: Platform, client: TesseraClient, name: str, states=("ACTIVE",), **extra) -> dict:
    a = await client.create_allocation(name, "bm.8gpu", **p.opts, **extra)
    return await client.wait_state(a["id"], set(states), timeout=BOOT_S)


async def power(client: TesseraClient, allocation: dict, action: str) -> dict:
    status, body, _ = await client.request("POST", f"/v1/allocations/{allocation['id']}/actions/{action}")
    assert status == 202, body

    async def done():
        got = (await client.request("GET", f"/v1/allocations/{allocation['id']}/actions/{body['id']}"))[1]
        return got if got["state"] in ("succeeded", "failed") else None
    return await eventually(done, timeout=90, what=f"the {action} of {allocation['id']}")


async def released(client: TesseraClient, allocation: dict) -> dict:
    await client.release(allocation["id"])
    await client.wait_state(allocation["id"], "RELEASED", timeout=120)
    return (await client.request("GET", f"/v1/allocations/{allocation['id']}/wipe"))[1]


async def test_a_tenant_gets_a_server_through_redfish_and_release_wipes_its_disks_with_evidence(platform):
    p, lab = platform, platform.lab
    async with p.admin() as admin:
        status, check, _ = await admin.request("POST", f"/v1/nodes/{p.node}/bmc/validate")
        assert status == 200 and check["ok"] and check["power_state"], check
        shown = (await admin.request("GET", f"/v1/nodes/{p.node}/bmc"))[1]
        assert shown["password_set"] and "password" not in shown and lab.password not in json.dumps(shown)
        client = await tenant(p, admin)
    try:
        a = await server(p, client, "bm-train")
        inst = a["instance"]
        assert (inst["driver"], inst["passthrough"], inst["instance_id"]) == ("redfish", "real", f"bm-{a['id']}")
        assert [ph["name"] for ph in inst["phases"]] == PHASES and inst["redfish_calls"] > 0
        assert await asyncio.to_thread(lab.running) and "TESSERA-READY" in lab.console()
        assert await asyncio.to_thread(lab.cdrom_sources)   # the image, inserted as virtual media
        # the tenant's power actions go through the BMC
        stop = await power(client, a, "stop")
        assert stop["state"] == "succeeded" and not await asyncio.to_thread(lab.running)
        start = await power(client, a, "start")
        assert start["state"] == "succeeded" and await asyncio.to_thread(lab.running)
        for dev in lab.loops:   # the tenant's data on every disk of the server
            await asyncio.to_thread(fill_pattern, dev)
        wipe = await released(client, a)
        assert not await asyncio.to_thread(lab.running) and await asyncio.to_thread(lab.cdrom_sources) == []
        assert wipe["status"] == "wiped" and [s["slot"] for s in wipe["slots"]] == list(range(SLOTS)), wipe
        for s in wipe["slots"]:
            [dev] = s["devices"]
            assert (dev["device"], dev["method"], dev["verified"]) == (lab.loops[s["slot"]], "blkdiscard+wipefs", True)
            assert s["ok"] and s["policy"] == WIPE_POLICY and s["agent_version"]
        assert not any([await asyncio.to_thread(pattern_on, d) for d in lab.loops])
    finally:
        await client.__aexit__(None, None, None)


async def test_the_wrong_bmc_password_fails_the_step_naming_the_401_and_leaves_the_server_off(platform):
    p, lab = platform, platform.lab
    async with p.admin() as admin:
        await set_bmc(admin, p, "not-the-password")
        status, check, _ = await admin.request("POST", f"/v1/nodes/{p.node}/bmc/validate")
        assert status == 200 and not check["ok"] and check["error_kind"] == "unauthorized", check
        client = await tenant(p, admin)
        try:
            a = await server(p, client, "bm-denied", states=("FAILED", "ACTIVE"))
            assert a["state"] == "FAILED", a
            assert "401" in a["reason"] and "power_off" in a["reason"], a["reason"]
            assert not await asyncio.to_thread(lab.running) and await asyncio.to_thread(lab.cdrom_sources) == []
        finally:
            await set_bmc(admin, p, lab.password)
            await client.__aexit__(None, None, None)


@pytest.mark.long
async def test_a_slot_whose_wipe_fails_is_quarantined_never_placed_and_returns_after_a_rewipe(platform):
    p, lab = platform, platform.lab
    async with p.admin() as admin:
        client = await tenant(p, admin)
        try:
            a = await server(p, client, "bm-ro")
            await asyncio.to_thread(set_read_only, lab.loops[2], True)
            wipe = await released(client, a)
            assert wipe["status"] == "quarantined", wipe
            bad = next(s for s in wipe["slots"] if s["slot"] == 2)
            assert not bad["ok"] and bad["reason"] and all(s["ok"] for s in wipe["slots"] if s["slot"] != 2)
            node = await eventually(lambda: _quarantined(admin, p.node), timeout=30, what="slot 2 quarantined")
            assert [q["slot"] for q in node["quarantined"]] == [2]
            # the node lacks a slot now: a whole-node shape cannot be placed on it
            refused = await server(p, client, "bm-none", states=("FAILED",), fail_fast=True)
            assert refused["state"] == "FAILED" and "capacity" in (refused["reason"] or "").lower(), refused
            await asyncio.to_thread(set_read_only, lab.loops[2], False)
            status, body, _ = await admin.request("POST", f"/v1/nodes/{p.node}/slots/2/rewipe")
            assert status == 202, body
            await eventually(lambda: _quarantined(admin, p.node, empty=True), timeout=60, what="slot 2 returned")
            b = await server(p, client, "bm-back")
            assert b["node_id"] == p.node
            assert (await released(client, b))["status"] == "wiped"
        finally:
            await asyncio.to_thread(set_read_only, lab.loops[2], False)
            await client.__aexit__(None, None, None)


async def _quarantined(admin: TesseraClient, node_id: str, empty: bool = False) -> dict | None:
    node = await admin.node(node_id)
    return node if bool(node.get("quarantined")) != empty else None



async def _port_moved_back_at(p: Platform, allocation_id: str) -> datetime:
    """When the leaf driver ran the release's move (the network schema's record of the commands it ran)."""
    conn = await asyncpg.connect(p.database_url)
    try:
        return await conn.fetchval("SELECT max(recorded_at) FROM network.fabric_calls WHERE allocation_id=$1 "
                                   "AND action='unbind' AND driver='leaf'", uuid.UUID(allocation_id))
    finally:
        await conn.close()


async def _cleaning(client: TesseraClient, allocation: dict) -> dict | None:
    a = await client.allocation(allocation["id"])
    return a if a["instance"]["network_phase"] == "cleaning" else None


async def guest(p: Platform, client: TesseraClient, name: str) -> dict:
    a = await client.create_allocation(name, "vm.1gpu", pool="vm", tolerations=["dedicated=vm:NoSchedule"])
    return await client.wait_state(a["id"], "ACTIVE", timeout=BOOT_S)


def address(allocation: dict) -> str:
    return allocation["instance"]["addresses"][0].split("/")[0]


async def sh(shell: GuestShell, command: str) -> tuple[int, str]:
    return await asyncio.to_thread(shell.run, command, 30)


async def pings(shell: GuestShell, ip: str) -> bool:
    return (await sh(shell, f"ping -c 1 -W 1 {ip}"))[0] == 0


async def never_pings(shell: GuestShell, ip: str) -> bool:
    return (await sh(shell, f"ping -c 2 -W 1 {ip}"))[0] != 0


async def test_a_server_and_a_vm_slice_of_one_tenant_share_its_network_and_nothing_else(platform):
    p, lab = platform, platform.lab
    async with p.admin() as admin:
        client, other = await tenant(p, admin), await tenant(p, admin)
    try:
        vm_a, vm_b, bm = await asyncio.gather(guest(p, client, "vm-a"), guest(p, other, "vm-b"),
                                              server(p, client, "bm-net"))
        inst = bm["instance"]
        assert inst["network_phase"] == "tenant" and [ph["name"] for ph in inst["phases"]] == PHASES
        assert inst["switch_port"] == {"leaf": lab.leaf.name, "port": "swp1"} and inst["hca_guids"] == [lab.hca_guid]
        bm_ip, a_ip, b_ip = address(bm), address(vm_a), address(vm_b)
        assert lab.leaf.port_vlans("swp1") not in ({PROVISIONING_VLAN}, set())
        with GuestShell(lab.shell_socket) as srv, GuestShell(vm.console_socket(vm_a["id"])) as ga, \
                GuestShell(vm.console_socket(vm_b["id"])) as gb:
            # the tenant's server and VM slice, across the underlay, both ways, ICMP and TCP
            assert await eventually(lambda: pings(srv, a_ip), timeout=30, what=f"the server reaching {a_ip}")
            assert await pings(ga, bm_ip)
            assert "200 OK" in (await sh(srv, http_get(a_ip)))[1]
            # handed off, the server reaches no provisioning service (the media server, the phone-home)
            assert await never_pings(srv, lab.host_address)
            # another tenant's guest reaches neither, even holding an address of the first tenant's subnet
            for target in {bm_ip, a_ip} - {b_ip}:
                assert await never_pings(gb, target)
            spare = next(ip for ip in (f"10.0.0.{n}" for n in range(200, 250)) if ip not in (bm_ip, a_ip, b_ip))
            assert (await sh(gb, f"ip addr add {spare}/24 dev eth0"))[0] == 0
            assert await never_pings(gb, bm_ip if bm_ip != b_ip else a_ip)
        wipe = await released(client, bm)
        assert wipe["status"] == "wiped"
        # the port went back to the provisioning network before the wipe began, and nothing of the tenant is left
        # on the leaf
        unbound_at = await _port_moved_back_at(p, bm["id"])
        assert unbound_at < min(datetime.fromisoformat(s["started_at"]) for s in wipe["slots"])
        assert lab.leaf.port_vlans("swp1") == {PROVISIONING_VLAN}
        gone = await eventually(lambda: _cleaning(client, bm), timeout=15, what="the server's network phase: cleaning")
        assert [ph["name"] for ph in gone["instance"]["phases"]] == [*PHASES, "port_to_provisioning"]
        assert lab.leaf.tessera_links() == []
        for a, c in ((vm_a, client), (vm_b, other)):
            await c.release(a["id"])
            await c.wait_state(a["id"], "RELEASED", timeout=120)
    finally:
        await client.__aexit__(None, None, None)
        await other.__aexit__(None, None, None)


async def test_a_port_the_leaf_refuses_fails_the_allocation_and_leaves_the_server_off_on_provisioning(platform):
    p, lab = platform, platform.lab
    async with p.admin() as admin:
        client = await tenant(p, admin)
    # the leaf loses the server's port (recabled by mistake): the hand-off cannot happen
    await asyncio.to_thread(lab.leaf.rename, "swp1", "swp1-moved")
    try:
        a = await server(p, client, "bm-refused", states=("FAILED", "ACTIVE"))
        assert a["state"] == "FAILED" and a["failed_step"] == "bind_port", a
        assert f"leaf {lab.leaf.name} has no port swp1" in a["reason"], a["reason"]
        # compensated: the server is off, its media ejected, nothing of the tenant on the leaf
        assert not await asyncio.to_thread(lab.running) and await asyncio.to_thread(lab.cdrom_sources) == []
        assert lab.leaf.port_vlans("swp1-moved") == {PROVISIONING_VLAN}
        assert lab.leaf.tessera_links() == []
    finally:
        await asyncio.to_thread(lab.leaf.rename, "swp1-moved", "swp1")
        await client.__aexit__(None, None, None)
