"""Tenant volumes in network-namespace slots (the sim driver), against real NATS JetStream, PostgreSQL, a real
btrfs file system with qgroup limits (a loop file, one per module) and the kernel's mount namespaces: each
allocation sees its volumes at /mnt/<name> in its own mount namespace and nowhere else, read-only ones refuse
writes, the quota holds, live mounts and unmounts answer volume_mount_changed, sources outside the volume roots
are refused, and a deprovision leaves no mount and no namespace. The tests play the saga and storage: they send
the node's commands on its subjects, and enter a slot with nsenter (``namespace_file`` finds its namespace)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from functools import partial
from pathlib import Path

import pytest

from services.node_agent.adapters.drivers import DriverError, SimDriver
from services.node_agent.adapters.drivers.namespaces import MountNamespaces, namespace_file
from services.node_agent.adapters.drivers.volumes import VolumeConfig, mounted_at
from services.node_agent.bootstrap import build
from services.node_agent.domain.model import InstanceSpec
from services.node_agent.domain.volumes import Volume
from services.storage.adapters.backends.base import VolumeSpec
from services.storage.adapters.backends.btrfs import BtrfsBackend
from tests.support.bus import of
from tests.support.bus import send_to_node as send
from tests.support.commands import deprovision_node_cmd, provision_node_cmd

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces, bind mounts and btrfs need root")]

MiB = 1 << 20


@pytest.fixture(scope="module")
def fs_root(btrfs_pool) -> Path:
    """The session's btrfs file system with quotas (tests/integration/conftest.py)."""
    return btrfs_pool.root


@pytest.fixture
def state_dir(tmp_path) -> Path:
    """The node's volume state; whatever a failed test left mounted there is taken away after it."""
    state = tmp_path / "volume-state"
    yield state
    for file in sorted((state / "mntns").glob("*")):
        if mounted_at(file):
            subprocess.run(["umount", "-l", str(file)], check=False)
    if mounted_at(state / "mntns"):
        subprocess.run(["umount", "-l", str(state / "mntns")], check=True)


async def make_volume(fs_root: Path, name: str, mode: str = "rw", size_mib: int = 20) -> dict:
    """A real btrfs volume (a subvolume with a qgroup limit) and its export, as storage sends it."""
    export = await BtrfsBackend(fs_root).create(VolumeSpec(uuid.uuid4(), uuid.uuid4(), name, size_mib * MiB))
    return {"volume_id": export.volume_id, "name": name, "mode": mode, "backend": "btrfs", "source": export.source,
            "options": {}}


def in_slot(file: Path, *argv: str) -> subprocess.CompletedProcess:
    """Run a command in the slot's mount namespace (blocking)."""
    return subprocess.run(["nsenter", f"--mount={file}", "--", *argv], capture_output=True, text=True, timeout=60)


class Node:
    def __init__(self, rt, node_id: uuid.UUID, state: Path, replies):
        self.rt, self.id, self.state, self.replies = rt, node_id, state, replies

    def namespace(self, alloc: uuid.UUID) -> Path:
        return namespace_file(self.state, alloc)

    async def provision(self, nc, alloc: uuid.UUID, volumes: list[dict], saga: uuid.UUID | None = None) -> dict:
        """Provision through the bus; the node's reply (node_provisioned or node_provision_failed)."""
        cmd = {**provision_node_cmd(self.id, alloc, saga or uuid.uuid4()), "volumes": volumes}
        await send(nc.jetstream(), "provision", self.id, cmd)
        [(_, env, _)] = await self.replies.wait_for(
            lambda i: i[1]["data"].get("allocation_id") == str(alloc) and i[1]["type"] in (
                "node_agent.node_provisioned", "node_agent.node_provision_failed"))
        return {**env["data"], "type": env["type"], "command": cmd}

    async def deprovision(self, nc, provision: dict) -> None:
        alloc = provision["allocation_id"]
        undo = deprovision_node_cmd(self.id, alloc, uuid.uuid4(), compensates=provision["command"]["idempotency_key"])
        await send(nc.jetstream(), "deprovision", self.id, undo)
        await self.replies.wait_for(of(alloc, "node_agent.node_deprovisioned"))

    async def volume_command(self, nc, verb: str, data: dict) -> dict:
        """Send mount_volume or unmount_volume; the node's volume_mount_changed answer (the data)."""
        env, _ = await send(nc.jetstream(), verb, self.id, data)
        [(subject, answer, _)] = await self.replies.wait_for(lambda i: i[1].get("causation_id") == str(env.id))
        assert subject == f"node_agent.evt.volume_mount_changed.{self.id}"
        assert answer["type"] == "node_agent.volume_mount_changed"
        return answer["data"]


@pytest.fixture
async def node(run_service, watch, fs_root, state_dir) -> Node:
    node_id = uuid.uuid4()
    driver = SimDriver(volumes=MountNamespaces(VolumeConfig((fs_root,), state_dir)))
    replies = await watch(f"node_agent.evt.*.{node_id}")
    rt = await run_service("node_agent", partial(build, driver=driver, environ={}), instance=str(node_id))
    return Node(rt, node_id, state_dir, replies)


async def test_each_allocation_sees_its_volumes_in_its_own_namespace_and_deprovision_leaves_none(node, nc, fs_root):
    data, ref, other = (await make_volume(fs_root, "data"), await make_volume(fs_root, "ref", "ro"),
                        await make_volume(fs_root, "other"))
    Path(ref["source"], "readme").write_text("shared, read-only\n")
    a, b = uuid.uuid4(), uuid.uuid4()
    pa = await node.provision(nc, a, [data, ref])
    pb = await node.provision(nc, b, [other])
    assert pa["type"] == pb["type"] == "node_agent.node_provisioned", pa.get("reason") or pb.get("reason")
    assert [(m["name"], m["mount_point"], m["mode"], m["via"], m["simulated"]) for m in pa["instance"]["mounts"]] == [
        ("data", "/mnt/data", "rw", "bind", False), ("ref", "/mnt/ref", "ro", "bind", False)]

    ns_a, ns_b = node.namespace(a), node.namespace(b)
    wrote = await asyncio.to_thread(in_slot, ns_a, "sh", "-c", "echo from-slot > /mnt/data/hello")
    assert wrote.returncode == 0, wrote.stderr
    assert Path(data["source"], "hello").read_text() == "from-slot\n"          # the volume itself, not a copy
    assert (await asyncio.to_thread(in_slot, ns_a, "cat", "/mnt/ref/readme")).stdout == "shared, read-only\n"
    refused = await asyncio.to_thread(in_slot, ns_a, "sh", "-c", "echo x > /mnt/ref/new")
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr        # EROFS
    # the qgroup limit holds in the slot: 20 MiB, no more
    full = await asyncio.to_thread(in_slot, ns_a, "dd", "if=/dev/urandom", "of=/mnt/data/big", "bs=1M", "count=40",
                                   "conv=fsync")
    assert full.returncode != 0 and "Disk quota exceeded" in full.stderr, full.stderr
    # only the allocation's own slots see it: not the other allocation, not the host
    assert (await asyncio.to_thread(in_slot, ns_b, "ls", "/mnt")).stdout.split() == ["other"]
    assert (await asyncio.to_thread(in_slot, ns_b, "test", "-e", "/mnt/data/hello")).returncode != 0
    assert not Path("/mnt/data").exists() and not Path("/mnt/other").exists()

    await node.deprovision(nc, pa)
    assert not ns_a.exists() and not (node.state / "mntns" / f"{a}.json").exists()
    assert ns_b.exists() and mounted_at(ns_b)                         # the other allocation keeps its own
    await node.deprovision(nc, pb)
    assert sorted(p.name for p in (node.state / "mntns").iterdir()) == []


async def test_live_mount_and_unmount_answer_volume_mount_changed(node, nc, fs_root):
    alloc = uuid.uuid4()
    provision = await node.provision(nc, alloc, [])
    assert provision["type"] == "node_agent.node_provisioned" and provision["instance"]["mounts"] == []
    assert not node.namespace(alloc).exists()                          # no volume, no namespace
    vol = await make_volume(fs_root, "late")
    base = {"allocation_id": alloc, "tenant_id": provision["command"]["tenant_id"]}

    mounted = await node.volume_command(nc, "mount_volume", {**base, "export": vol})
    assert mounted["ok"] is True and mounted["mounted"] is True and mounted["reason"] is None
    assert mounted["mount"] == {"volume_id": str(vol["volume_id"]), "name": "late", "mount_point": "/mnt/late",
                                "mode": "rw", "via": "bind", "tag": None, "simulated": False}
    seen = await asyncio.to_thread(in_slot, node.namespace(alloc), "sh", "-c",
                                   "echo live > /mnt/late/f && cat /mnt/late/f")
    assert seen.stdout == "live\n", seen.stderr
    again = await node.volume_command(nc, "mount_volume", {**base, "export": vol})    # idempotent
    assert again["ok"] is True and again["mount"] == mounted["mount"]

    unmounted = await node.volume_command(nc, "unmount_volume", {**base, "volume_id": vol["volume_id"]})
    assert unmounted["ok"] is True and unmounted["mounted"] is False
    assert (await asyncio.to_thread(in_slot, node.namespace(alloc), "test", "-e", "/mnt/late")).returncode != 0
    assert (await node.volume_command(nc, "unmount_volume", {**base, "volume_id": vol["volume_id"]}))["ok"] is True

    # the kept provision command follows: a remade instance would get exactly the volumes mounted now
    async with node.rt.pool.acquire() as conn:
        assert (await conn.fetchval("SELECT command->'volumes' FROM instances WHERE allocation_id=$1", alloc)) == "[]"
    await node.deprovision(nc, provision)
    assert not node.namespace(alloc).exists()


async def test_a_volume_command_for_an_allocation_not_here_or_another_tenants_is_refused(node, nc, fs_root):
    alloc = uuid.uuid4()
    provision = await node.provision(nc, alloc, [])
    vol = await make_volume(fs_root, "nope")
    elsewhere = await node.volume_command(nc, "mount_volume", {"allocation_id": uuid.uuid4(), "tenant_id": uuid.uuid4(),
                                                               "export": vol})
    assert elsewhere["ok"] is False and elsewhere["mounted"] is False
    assert elsewhere["reason"] == f"allocation {elsewhere['allocation_id']} has no instance on node {node.id}"
    stranger = await node.volume_command(nc, "unmount_volume", {"allocation_id": alloc, "tenant_id": uuid.uuid4(),
                                                                "volume_id": vol["volume_id"]})
    assert stranger["ok"] is False and "has no instance on node" in stranger["reason"]
    assert not node.namespace(alloc).exists()
    await node.deprovision(nc, provision)


async def test_a_source_outside_the_volume_roots_is_refused_even_through_a_symlink(node, nc, fs_root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (fs_root / "escape").symlink_to(outside)
    try:
        vol = {**await make_volume(fs_root, "data"), "source": str(fs_root / "escape")}
        failed = await node.provision(nc, uuid.uuid4(), [vol])
        assert failed["type"] == "node_agent.node_provision_failed"
        assert f"(really {str(outside)!r}) is not below a volume root" in failed["reason"]
        assert not any((node.state / "mntns").glob("*"))
        dotted = {**vol, "source": f"{fs_root}/tenants/../../{outside.name}"}
        assert "names '..'" in (await node.provision(nc, uuid.uuid4(), [dotted]))["reason"]
        root_itself = {**vol, "source": str(fs_root)}
        assert "is not below a volume root" in (await node.provision(nc, uuid.uuid4(), [root_itself]))["reason"]
        alloc = uuid.uuid4()
        provision = await node.provision(nc, alloc, [])
        live = await node.volume_command(nc, "mount_volume", {"allocation_id": alloc, "export": vol,
                                                              "tenant_id": provision["command"]["tenant_id"]})
        assert live["ok"] is False and "is not below a volume root" in live["reason"]
        assert not node.namespace(alloc).exists()
    finally:
        (fs_root / "escape").unlink()


async def test_appliance_volumes_are_rendered_and_reported_simulated_without_a_namespace(node, nc):
    alloc = uuid.uuid4()
    lustre = {"volume_id": uuid.uuid4(), "name": "scratch", "mode": "rw", "backend": "lustre",
              "source": "10.0.0.2@o2ib:/fs0", "options": {"fstype": "lustre", "flock": ""}}
    provision = await node.provision(nc, alloc, [lustre])
    [mount] = provision["instance"]["mounts"]
    assert (mount["via"], mount["simulated"], mount["mount_point"]) == ("lustre", True, "/mnt/scratch")
    assert not node.namespace(alloc).exists()
    await node.deprovision(nc, provision)
    assert not (node.state / "mntns" / f"{alloc}.json").exists()


async def test_a_deprovision_after_the_agent_lost_its_instances_still_takes_the_volumes_away(fs_root, state_dir):
    """The sim keeps its instances in memory; its namespaces outlive it: a fresh driver cleans them up."""
    vol = await make_volume(fs_root, "kept")
    volume = Volume.of(vol["volume_id"], "kept", "rw", "btrfs", vol["source"])
    spec = InstanceSpec(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), (0,), volumes=(volume,))
    config = VolumeConfig((fs_root,), state_dir)
    await SimDriver(volumes=MountNamespaces(config)).provision(spec)
    assert mounted_at(namespace_file(state_dir, spec.allocation_id))
    restarted = SimDriver(volumes=MountNamespaces(config))
    with pytest.raises(DriverError, match="no instance"):
        await restarted.mount(spec.allocation_id, volume)
    await restarted.deprovision(spec.allocation_id)
    await restarted.deprovision(spec.allocation_id)                   # idempotent
    assert not namespace_file(state_dir, spec.allocation_id).exists()


async def test_a_bare_metal_server_refuses_a_btrfs_volume_before_touching_its_bmc(fs_root, tmp_path):
    """A path on the storage host cannot reach a physical server: the provision fails at once, naming why."""
    from services.node_agent.adapters.drivers.redfish.config import RedfishConfig
    from services.node_agent.adapters.drivers.redfish.driver import RedfishDriver
    from services.node_agent.domain.model import BootImage, GuestConfig

    async def no_bmc():
        raise AssertionError("the BMC must not be asked")
    driver = RedfishDriver(RedfishConfig.from_env({"TESSERA_REDFISH_STATE_DIR": str(tmp_path / "redfish"),
                                                   "TESSERA_REDFISH_SERVER_ADDRESS": "172.30.9.10/24"}), no_bmc)
    vol = await make_volume(fs_root, "data")
    spec = InstanceSpec(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), (0,),
                        guest=GuestConfig(BootImage("img", "raw", "/nonexistent", "0" * 64), "bm-1"),
                        volumes=(Volume.of(vol["volume_id"], "data", "rw", "btrfs", vol["source"]),))
    try:
        with pytest.raises(DriverError, match="cannot be mounted into a bare-metal server over the network"):
            await driver.provision(spec)
        assert await driver.list_instances() == []
    finally:
        await driver.close()
