"""VM slices made real: through the gateway, the saga and three node-agents running the libvirt driver
on a real libvirtd (QEMU, TCG), each node in its own network namespace on one underlay (the tenant-network lab), the
guests booting the project's image with their NoCloud seed on their tenant's network.

"From inside a guest" is its interactive serial console (ttyS1, a UNIX socket the domain binds): the test runs
ping and wget there. The guests' taps are plugged into the tenant bridges by the node's dataplane, so the
isolation between tenants is the one tests/e2e/test_network_isolation.py proves with namespaces, now with real guests.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid

import pytest

from services.node_agent.adapters.dataplane.lab import UNDERLAY_DEV, Lab
from services.node_agent.domain.dataplane.names import slot_port_name
from services.node_agent.domain.vm.domain_xml import domain_name
from tests.support import vm
from tests.support.disks import LoopDisks
from tests.support.guest import GuestShell, http_get
from tests.support.platform import E2E_ENV
from tests.support.polling import eventually
from tooling.client import TesseraClient
from tooling.demo_lab import remove_domains_of
from tooling.platform import Platform

pytestmark = [pytest.mark.root, pytest.mark.timeout(900),
              pytest.mark.skipif(os.geteuid() != 0, reason="VMs and kernel networking need root")]

WIPE_POLICY = "nvme-secure-erase+discard"   # NVMe format where the disk is an NVMe controller, else blkdiscard
BOOT_S = 120   # request → ACTIVE, booting under TCG on a busy 2-core machine
STEP_S = 60    # the platform's provision_node timeout: a boot takes seconds, a dead node-agent fails it in a minute


@pytest.fixture(scope="module")
async def image():
    return await asyncio.to_thread(vm.host_ready)


@pytest.fixture(scope="module")
async def platform(tmp_path_factory, image):
    """A platform of its own: its provision_node step may take a VM's boot (the package's times out in 4 s)."""
    work = tmp_path_factory.mktemp("vm-platform")
    p = Platform(work, env={**E2E_ENV, "TESSERA_SAGA_STEP_TIMEOUTS": f"provision_node={STEP_S}"}, durable=False)
    lab = Lab(3, dataplanes=False)
    p.lab, p.state_dirs, p.disks = lab, {}, {}
    try:
        await p.start()
        await asyncio.to_thread(lab.build)
        async with p.admin() as admin:
            await admin.define_pool("vm", "spread", {"dedicated": "vm:NoSchedule"})
            ids = []
            for i, ns in enumerate(lab.node_ns):
                state = work / f"node{i}"
                # each slot's NVMe: a loop device full of "tenant data", wiped on release (blkdiscard: no NVMe here)
                disks = await asyncio.to_thread(LoopDisks(work / f"disks{i}", 8, mib=4).attach)
                env = {**vm.VM_ENV, "TESSERA_NODE_DATAPLANE": "kernel", "TESSERA_NODE_NETNS": ns,
                       "TESSERA_NODE_UNDERLAY_DEV": UNDERLAY_DEV, "TESSERA_LIBVIRT_STATE_DIR": str(state),
                       "TESSERA_NODE_RECONCILE_S": "2", "TESSERA_WIPE_DEVICES": json.dumps(disks.device_map())}
                node = await p.add_node(f"vm-{uuid.uuid4().hex[:6]}-{i}", env=env, pool="vm", wipe_policy=WIPE_POLICY)
                ids.append(node)
                p.state_dirs[node], p.disks[node] = state, disks
            lab.node_ids = [uuid.UUID(i) for i in ids]
            status, body, _ = await admin.request("POST", "/v1/images", json_body=vm.catalog_entry(image, default=True))
            assert status == 201, body
            p.image = body
        p.opts = {"pool": "vm", "tolerations": ["dedicated=vm:NoSchedule"]}
        yield p
    finally:
        try:
            await p.stop()
        finally:
            # no domain of its nodes may outlive the test (a failed test's included)
            await asyncio.to_thread(remove_domains_of, set(getattr(p, "state_dirs", {})))
            await asyncio.to_thread(lab.destroy)
            for disks in p.disks.values():
                await asyncio.to_thread(disks.detach)


async def tenant_client(p: Platform, admin) -> TesseraClient:
    t = await admin.create_tenant(f"vm-{uuid.uuid4().hex[:8]}")
    await admin.set_quota(t["id"], "vm", "H100", 8)
    u = await admin.create_user(t["id"], "researcher", "tenant_user")
    return await TesseraClient(p.gateway_url, u["api_key"]).__aenter__()


async def booted(client: TesseraClient, name: str, opts: dict, **extra) -> dict:
    a = await client.create_allocation(name, "vm.1gpu", **opts, **extra)
    return await client.wait_state(a["id"], "ACTIVE", timeout=BOOT_S)


async def attachment_of(client: TesseraClient, allocation: dict) -> dict:
    nets = (await client.request("GET", "/v1/networks"))[1]["items"]
    network_id = next(n["id"] for n in nets if n["name"] == "default")

    async def found() -> list[dict]:
        items = (await client.request("GET", f"/v1/networks/{network_id}/attachments"))[1]["items"]
        return [i for i in items if i["allocation_id"] == allocation["id"]]
    return (await eventually(found, timeout=15, what=f"the attachment of {allocation['id']}"))[0]


def shell(p: Platform, allocation: dict) -> GuestShell:
    return GuestShell(vm.console_socket(allocation["id"]))


async def run(p: Platform, allocation: dict, command: str, timeout: float = 30) -> tuple[int, str]:
    return await asyncio.to_thread(shell(p, allocation).run, command, timeout)


async def release_all(client: TesseraClient, allocations: list[dict]) -> None:
    for a in allocations:
        await client.release(a["id"])
    for a in allocations:
        await client.wait_state(a["id"], "RELEASED", timeout=120)


def host_leftovers(p: Platform, allocation: dict, port: str) -> list[str]:
    node_ns = p.lab.node_ns[[str(i) for i in p.lab.node_ids].index(allocation["node_id"])]
    links = subprocess.run(["ip", "-n", node_ns, "-o", "link"], capture_output=True, text=True).stdout
    here = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found = vm.leftovers(allocation["id"], p.state_dirs[allocation["node_id"]])
    return found + [f"tap {port}" for out in (links, here) if f" {port}:" in out or f" {port}@" in out]


async def test_a_tenants_guests_boot_on_its_network_reach_each_other_and_no_other_tenant(platform):
    p = platform
    async with p.admin() as admin:
        a, b = await tenant_client(p, admin), await tenant_client(p, admin)
    try:
        a1, a2 = await asyncio.gather(booted(a, "train-1", p.opts), booted(a, "train-2", p.opts))
        b1 = await booted(b, "other-1", p.opts)
        att = {"a1": await attachment_of(a, a1), "a2": await attachment_of(a, a2), "b1": await attachment_of(b, b1)}
        assert a1["node_id"] != a2["node_id"], "spread pool: the two slices are on different nodes"
        if att["b1"]["ip_address"] != att["a1"]["ip_address"]:   # a1 is, from here on, the one B's guest shares
            a1, a2, att = a2, a1, {**att, "a1": att["a2"], "a2": att["a1"]}
        assert att["b1"]["ip_address"] == att["a1"]["ip_address"], "both tenants use the same CIDR and addresses"
        for key, alloc in (("a1", a1), ("a2", a2), ("b1", b1)):
            inst = alloc["instance"]
            assert (inst["driver"], inst["dataplane"], inst["passthrough"]) == ("libvirt", "kernel", "simulated")
            assert inst["instance_id"] == domain_name(alloc["id"]) and inst["image"] == p.image["name"]
            assert inst["node_id"] == alloc["node_id"] and inst["booted_at"]
            # what the API reports is what the guest has
            _, hostname = await run(p, alloc, "hostname")
            _, addr = await run(p, alloc, "ip -o -4 addr show dev eth0")
            _, mac = await run(p, alloc, "cat /sys/class/net/eth0/address")
            assert hostname.strip() == inst["hostname"], key
            assert f"{att[key]['ip_address']}/{att[key]['prefix_len']}" in addr, key
            assert mac.strip() == att[key]["mac_address"], key
        a2_ip = att["a2"]["ip_address"]
        rc, out = await run(p, a1, f"ping -c 3 -W 2 {a2_ip}")
        assert rc == 0, out
        # the guest's NIC has the tenant network's MTU (VXLAN takes 50 bytes): a full-size datagram is fragmented
        # by the guest, not dropped at the bridge
        _, link = await run(p, a1, "ip -o link show dev eth0")
        assert " mtu 1450 " in link, link
        rc, out = await run(p, a1, f"ping -c 2 -W 2 -s 1472 {a2_ip}")
        assert rc == 0, out
        rc, page = await run(p, a1, http_get(a2_ip))
        assert rc == 0 and a2["instance"]["hostname"] in page, page
        # tenant B's guest has A's first address; from A's second guest that address is A's, never B's
        rc, page = await run(p, a2, http_get(att["a1"]["ip_address"]))
        assert rc == 0 and a1["instance"]["hostname"] in page and b1["instance"]["hostname"] not in page
        # and B reaches nothing of A: not a2's address (nobody has it in B's network), by ping or TCP
        rc, out = await run(p, b1, f"ping -c 2 -W 2 {a2_ip}")
        assert rc != 0, out
        rc, out = await run(p, b1, http_get(a2_ip))
        assert "HTTP/1" not in out, out

        ports = {k: slot_port_name(uuid.UUID(v["attachment_id"])) for k, v in att.items()}
        await release_all(a, [a1, a2])
        await release_all(b, [b1])
        for key, alloc in (("a1", a1), ("a2", a2), ("b1", b1)):
            assert await asyncio.to_thread(host_leftovers, p, alloc, ports[key]) == [], key
            await wiped(p, a if key != "b1" else b, alloc)
    finally:
        await a.__aexit__(None, None, None)
        await b.__aexit__(None, None, None)


async def wiped(p: Platform, client: TesseraClient, alloc: dict) -> None:
    """The slice's slot was wiped on release, with evidence the tenant reads; the node's other disks were not."""
    wipe = (await client.request("GET", f"/v1/allocations/{alloc['id']}/wipe"))[1]
    assert wipe["status"] == "wiped" and len(wipe["slots"]) == 1, wipe
    slot, [device] = wipe["slots"][0]["slot"], wipe["slots"][0]["devices"]
    disks = p.disks[alloc["node_id"]]
    assert (device["device"], device["method"], device["verified"]) == (disks.devices[slot], "blkdiscard+wipefs", True)
    assert not await asyncio.to_thread(disks.has_pattern, slot)
    kept = [await asyncio.to_thread(disks.has_pattern, i) for i in range(8) if i != slot]
    assert any(kept), "only the released slot's disk is wiped"


async def failed(client: TesseraClient, name: str, opts: dict, **extra) -> dict:
    a = await client.create_allocation(name, "vm.1gpu", **opts, **extra)
    return await client.wait_state(a["id"], {"FAILED", "ACTIVE"}, timeout=BOOT_S + STEP_S)


async def test_an_image_whose_checksum_does_not_match_fails_naming_it_and_leaves_nothing(platform, image):
    p = platform
    async with p.admin() as admin:
        name = f"tampered-{uuid.uuid4().hex[:6]}"
        await admin.request("POST", "/v1/images", json_body=vm.catalog_entry(image, name=name, sha256="1" * 64))
        client = await tenant_client(p, admin)
    try:
        a = await failed(client, "bad-image", p.opts, image=name)
        assert (a["state"], a["failed_step"]) == ("FAILED", "provision_node"), a
        assert f"image {name}: checksum mismatch" in a["reason"], a["reason"]
        for state in p.state_dirs.values():   # whichever node it was reserved on
            assert await asyncio.to_thread(vm.leftovers, a["id"], state) == []
    finally:
        await client.__aexit__(None, None, None)


async def test_with_libvirtd_stopped_the_step_fails_clearly_and_the_saga_compensates(platform):
    p = platform
    async with p.admin() as admin:
        client = await tenant_client(p, admin)
    subprocess.run(["pkill", "-x", "libvirtd"], check=False)
    await eventually(lambda: asyncio.to_thread(lambda: subprocess.run(["pgrep", "-x", "libvirtd"]).returncode),
                     until=lambda rc: rc != 0, timeout=30, what="libvirtd to stop")
    try:
        a = await failed(client, "no-hypervisor", p.opts)
        assert (a["state"], a["failed_step"]) == ("FAILED", "provision_node"), a
        assert "libvirt at qemu:///system is unreachable" in a["reason"], a["reason"]
    finally:
        await asyncio.to_thread(vm.host_ready)   # libvirtd back (its guests kept running meanwhile)
        await client.__aexit__(None, None, None)
    assert vm.domain_name(a["id"]) not in await asyncio.to_thread(vm.domains)


@pytest.mark.long
async def test_a_node_agent_killed_mid_boot_times_out_the_step_and_its_orphan_domain_is_removed(platform):
    p = platform
    async with p.admin() as admin:
        client = await tenant_client(p, admin)
    try:
        created = await client.create_allocation("orphan", "vm.1gpu", **p.opts)
        name = vm.domain_name(created["id"])
        await eventually(lambda: asyncio.to_thread(vm.domains), until=lambda names: name in names, timeout=BOOT_S,
                         interval=0.05, what=f"domain {name} defined")
        node = (await client.allocation(created["id"]))["node_id"]
        p.kill(f"node_agent:{node}")
        a = await client.wait_state(created["id"], {"FAILED", "ACTIVE"}, timeout=STEP_S + 120)
        assert (a["state"], a["failed_step"]) == ("FAILED", "provision_node") and "timed out" in a["reason"], a
        assert name in await asyncio.to_thread(vm.domains), "nobody removed it while the agent was away"
        await p.restart(f"node_agent:{node}")
        # the queued compensation, or the reconcile, removes the domain the dead agent left
        await eventually(lambda: asyncio.to_thread(vm.domains), until=lambda names: name not in names, timeout=60,
                         what=f"domain {name} removed")
        assert await asyncio.to_thread(vm.leftovers, created["id"], p.state_dirs[node]) == []
    finally:
        await client.__aexit__(None, None, None)


@pytest.mark.long
async def test_a_tenants_volume_is_mounted_in_its_guest_stops_writes_at_its_size_there_and_no_other_guest_has_it(
        platform):
    """The issue's "done when": a tenant creates a volume, gets it mounted into its VM (virtiofs, at /mnt/<name>),
    hits its quota inside the guest, and no other tenant's guest can reach it."""
    p = platform
    async with p.admin() as admin:
        a, b = await tenant_client(p, admin), await tenant_client(p, admin)
    try:
        v = await a.create_volume("data", 50 << 20)
        v = await a.wait_volume(v["id"], "available", timeout=30)
        a1 = await booted(a, "with-data", p.opts, volumes=[{"volume_id": v["id"], "mode": "rw"}])
        b1 = await booted(b, "without", p.opts)
        [mount] = a1["instance"]["mounts"]
        assert (mount["mount_point"], mount["via"], mount["mode"]) == ("/mnt/data", "virtiofs", "rw"), mount
        rc, out = await run(p, a1, "dd if=/dev/zero of=/mnt/data/fill bs=1M count=80 conv=fsync; echo rc=$?", 120)
        assert "Disk quota exceeded" in out and "rc=0" not in out, out
        _, size = await run(p, a1, "wc -c </mnt/data/fill")
        assert 40 << 20 <= int(size.strip()) <= 50 << 20, size
        # the API's usage is the qgroup's, read on the storage host
        path = p.storage.root / "tenants" / a1["tenant_id"] / v["id"]
        qgroup = await asyncio.to_thread(subprocess.run, ["btrfs", "qgroup", "show", "-re", "--raw", "--sync",
                                                          str(path)], capture_output=True, text=True, check=True)
        subvolid = (await asyncio.to_thread(subprocess.run, ["btrfs", "inspect-internal", "rootid", str(path)],
                                            capture_output=True, text=True, check=True)).stdout.strip()
        referenced = int(next(line.split()[1] for line in qgroup.stdout.splitlines()
                              if line.split()[:1] == [f"0/{subvolid}"]))
        await eventually(lambda: a.volume(v["id"]), until=lambda x: x["used_bytes"] == referenced, timeout=15,
                         what="the volume's usage as the qgroup counts it")
        # B's guest has no such file system: no virtiofs mount, nothing under /mnt of A's
        _, mounts = await run(p, b1, "cat /proc/mounts; ls /mnt")
        assert "virtiofs" not in mounts and "data" not in mounts.split(), mounts
        await b.request("POST", f"/v1/volumes/{v['id']}/attachments", json_body={"allocation_id": b1["id"]},
                        expect=(404,))
        await release_all(a, [a1])
        await release_all(b, [b1])
        virtiofsd = await asyncio.to_thread(subprocess.run, ["pgrep", "-f", f"virtiofsd.*{v['id']}"],
                                            capture_output=True, text=True)
        assert virtiofsd.stdout == "", "no virtiofs daemon outlives its domain"
        assert (await a.wait_volume(v["id"], "available"))["attachments"] == []
    finally:
        await a.__aexit__(None, None, None)
        await b.__aexit__(None, None, None)
