"""Bare metal made real: through the gateway, a bare_metal allocation is provisioned by the node's
redfish driver against a real sushy-emulator BMC whose server is a real QEMU domain (TCG); the server boots the
project's image from virtual media and phones home; release powers it off, ejects the media and wipes its disks
(loop devices full of "tenant data") with evidence; a wrong BMC password fails the step naming the 401 and leaves
the server off; a slot whose wipe fails is quarantined, never placed, and returns after a provider admin's
re-wipe. Nothing is mocked between Tessera and the emulator."""
from __future__ import annotations

import asyncio
import json
import os
import uuid

import pytest

from tests.support import vm
from tests.support.disks import fill_pattern, pattern_on, set_read_only
from tests.support.platform import E2E_ENV
from tests.support.polling import eventually
from tooling.bmc_lab import BmcLab
from tooling.client import TesseraClient
from tooling.platform import Platform

pytestmark = [pytest.mark.root, pytest.mark.timeout(900),
              pytest.mark.skipif(os.geteuid() != 0, reason="a BMC lab (bridges, loop devices, libvirt) needs root")]

SLOTS = 8                                    # bm.8gpu: the whole HGX node, one NVMe per slot
WIPE_POLICY = "nvme-secure-erase+discard"    # the loop devices are no NVMe controllers: blkdiscard
BOOT_S = 180
PHASES = ["power_off", "insert_media", "boot_override", "power_on", "deploy"]


@pytest.fixture(scope="module")
async def platform(tmp_path_factory):
    image = await asyncio.to_thread(vm.host_ready)
    work = tmp_path_factory.mktemp("bm-platform")
    lab = BmcLab(disks=SLOTS)
    p = Platform(work, env={**E2E_ENV, "TESSERA_SAGA_STEP_TIMEOUTS": "provision_node=120,wipe_slots=60"},
                 durable=False)
    p.lab = lab
    try:
        await asyncio.to_thread(lab.start)
        await p.start()
        env = {**lab.node_env(work / "redfish"), "TESSERA_REDFISH_TIMEOUTS": "deploy=90"}
        async with p.admin() as admin:
            await admin.define_pool("bm", "pack", {"dedicated": "bm:NoSchedule"})
            p.node = await p.add_node(f"bm-{lab.tag}", env=env, pool="bm", wipe_policy=WIPE_POLICY)
            status, body, _ = await admin.request("POST", "/v1/images", json_body=vm.catalog_entry(image, default=True))
            assert status == 201, body
            await set_bmc(admin, p, lab.password)
        p.opts = {"pool": "bm", "tolerations": ["dedicated=bm:NoSchedule"]}
        yield p
    finally:
        try:
            await p.stop()
        finally:
            await asyncio.to_thread(lab.stop)


async def set_bmc(admin: TesseraClient, p: Platform, password: str) -> dict:
    status, body, _ = await admin.request("PUT", f"/v1/nodes/{p.node}/bmc", json_body=p.lab.bmc_body(password))
    assert status == 200, body
    return body


async def tenant(p: Platform, admin: TesseraClient) -> TesseraClient:
    t = await admin.create_tenant(f"bm-{uuid.uuid4().hex[:8]}")
    await admin.set_quota(t["id"], "bm", "H100", 16)
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

