"""Tenant volumes through the whole platform: the gateway, the storage service on a real btrfs (a loop file
of the platform's data folder, one subvolume and qgroup per volume), the saga, and node-agents whose slots are
network-namespace slots with a mount namespace each (``nsenter --mount=<state>/mntns/<allocation>`` is "inside the
slot"). The VM guests' side (virtiofs, EDQUOT in the guest) is tests/e2e/test_vm_slices.py's.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from services.node_agent.adapters.drivers.namespaces import namespace_file
from tests.support.polling import eventually
from tooling.client import ApiError

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="btrfs and mount namespaces need root")]

MIB = 1 << 20


def in_slot(platform, allocation_id: str, command: str) -> subprocess.CompletedProcess:
    """Run ``command`` (sh) inside the allocation's slot: its own mount namespace."""
    ns = namespace_file(platform.storage.node_state, allocation_id)
    return subprocess.run(["nsenter", f"--mount={ns}", "--", "sh", "-c", command], capture_output=True, text=True,
                          timeout=60)


def subvolume(platform, tenant_id: str, volume_id: str) -> Path:
    return platform.storage.root / "tenants" / tenant_id / volume_id


def qgroup_referenced(path: Path) -> int:
    """The referenced bytes of the subvolume's qgroup, as btrfs counts them (synced)."""
    subvolid = subprocess.run(["btrfs", "inspect-internal", "rootid", str(path)], capture_output=True, text=True,
                              check=True).stdout.strip()
    out = subprocess.run(["btrfs", "qgroup", "show", "-re", "--raw", "--sync", str(path)], capture_output=True,
                         text=True, check=True).stdout
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == [f"0/{subvolid}"])
    return int(row[1])


def quota_evidence(platform, allocation_id: str, path: Path) -> str:
    """What a failed quota assertion needs to be understood (it is not reproduced on demand): the subvolume's
    qgroup and limit, the file system's quota state, what the slot has at /mnt/data against the subvolume on the
    host, and what was written where."""
    def run(*argv: str) -> str:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
        return (done.stdout + done.stderr).strip()
    uuid_ = run("findmnt", "-no", "UUID", str(platform.storage.root))
    sysfs = Path("/sys/fs/btrfs") / uuid_ / "qgroups"
    flags = {f: (sysfs / f).read_text().strip() for f in ("enabled", "inconsistent", "mode") if (sysfs / f).exists()}
    host = os.stat(path)
    blob = path / "blob"
    slot = in_slot(platform, allocation_id, "findmnt -no SOURCE,FSTYPE /mnt/data; stat -c %d/%i /mnt/data; ls -l /mnt/data")
    return (f"qgroup: {run('btrfs', 'qgroup', 'show', '-re', '--raw', '--sync', str(path))}\n"
            f"quota state {flags}; subvolume dev/ino {host.st_dev} {host.st_ino}; "
            f"blob in the subvolume: {blob.stat().st_size if blob.exists() else None} bytes\n"
            f"in the slot: {slot.stdout}{slot.stderr}")


def qgroups(root: Path) -> set[str]:
    out = subprocess.run(["btrfs", "qgroup", "show", "--raw", str(root)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith("0/")}


async def available(client, name: str, size: int, **kw) -> dict:
    v = await client.create_volume(name, size, **kw)
    return await client.wait_volume(v["id"], "available", timeout=30)


async def active(client, name: str, **kw) -> dict:
    a = await client.create_allocation(name, "vm.1gpu", **kw)
    return await client.wait_state(a["id"], "ACTIVE", timeout=30)


async def test_a_volume_is_mounted_only_in_its_allocations_slot_enforces_its_size_and_is_reported(platform,
                                                                                                   make_tenant):
    a, b = await make_tenant(), await make_tenant()
    data = await available(a.user, "data", 50 * MIB)
    b_data = await available(b.user, "data", 50 * MIB)   # the same name in another tenant: its own volume
    alloc = await active(a.user, "train", volumes=[{"volume_id": data["id"], "mode": "rw"}])
    [mount] = alloc["instance"]["mounts"]
    assert (mount["volume_id"], mount["mount_point"], mount["mode"], mount["via"]) == (
        data["id"], "/mnt/data", "rw", "bind")
    assert (await a.user.volume(data["id"]))["state"] == "in-use"

    # writing past 50 MiB inside the slot fails: the qgroup refuses it (EDQUOT)
    out = await asyncio.to_thread(in_slot, platform, alloc["id"],
                                  "dd if=/dev/urandom of=/mnt/data/blob bs=1M count=80 conv=fsync")
    path = subvolume(platform, a.id, data["id"])
    if not (out.returncode != 0 and "Disk quota exceeded" in out.stderr):
        pytest.fail(f"80 MiB written into a 50 MiB volume: {out}\n{quota_evidence(platform, alloc['id'], path)}")
    written = os.path.getsize(path / "blob")
    assert 40 * MIB <= written <= 50 * MIB, written

    # the usage the API reports is the qgroup's
    referenced = await asyncio.to_thread(qgroup_referenced, path)
    await eventually(lambda: a.user.volume(data["id"]), until=lambda v: v["used_bytes"] == referenced, timeout=15,
                     what="the volume's usage reported")
    quotas = await a.user.storage_quotas(a.id)
    standard = next(q for q in quotas["items"] if q["storage_class"] == "standard")
    assert standard["used_bytes"] == referenced and standard["volumes"] == 1

    # tenant B: its allocation's slot has its own /mnt/data, without A's data; A's volume is a 404 to B
    b_alloc = await active(b.user, "other", volumes=[{"volume_id": b_data["id"]}])
    out = await asyncio.to_thread(in_slot, platform, b_alloc["id"], "ls -a /mnt/data; ls /mnt")
    assert out.returncode == 0 and "blob" not in out.stdout and out.stdout.split()[-1] == "data", out
    with pytest.raises(ApiError) as refused:
        await b.user.request("POST", f"/v1/volumes/{data['id']}/attachments",
                             json_body={"allocation_id": b_alloc["id"], "mode": "ro"}, expect=(202,))
    assert refused.value.status == 404
    with pytest.raises(ApiError) as refused:
        await b.user.create_allocation("steal", "vm.1gpu", volumes=[{"volume_id": data["id"]}])
    assert refused.value.status == 422
    assert data["id"] not in [v["id"] for v in (await b.user.request("GET", "/v1/volumes"))[1]["items"]]

    # attached to a running allocation: no delete
    with pytest.raises(ApiError) as refused:
        await a.user.delete_volume(data["id"])
    assert refused.value.status == 409

    ns = namespace_file(platform.storage.node_state, alloc["id"])
    for client, x in ((a.user, alloc), (b.user, b_alloc)):
        await client.release(x["id"])
        await client.wait_state(x["id"], "RELEASED", timeout=30)
    assert not ns.exists(), "the slot's mount namespace is gone with its allocation"
    exports = json.loads((platform.storage.root / ".tessera" / "exports" / f"{data['id']}.json").read_text())
    assert exports["clients"] == {}, "the released slot's address is off the volume's access list"
    assert (await a.user.wait_volume(data["id"], "available"))["attachments"] == []
    assert os.path.getsize(path / "blob") == written, "a named volume keeps its data after its allocation"


async def test_read_only_attach_refuses_writes_and_a_scratch_volume_goes_with_its_allocation(platform, make_tenant):
    t = await make_tenant()
    shared = await available(t.user, "reference", 20 * MIB, shared=True)
    writer = await active(t.user, "writer", volume_gb=1, volumes=[{"volume_id": shared["id"], "mode": "rw"}])
    reader = await active(t.user, "reader", volumes=[{"volume_id": shared["id"], "mode": "ro"}])
    out = await asyncio.to_thread(in_slot, platform, writer["id"], "echo weights >/mnt/reference/model && sync")
    assert out.returncode == 0, out
    out = await asyncio.to_thread(in_slot, platform, reader["id"], "cat /mnt/reference/model")
    assert out.stdout.strip() == "weights", out
    out = await asyncio.to_thread(in_slot, platform, reader["id"], "echo x >/mnt/reference/other")
    assert out.returncode != 0 and "Read-only file system" in out.stderr, out

    scratch = next(m for m in writer["instance"]["mounts"] if m["volume_id"] != shared["id"])
    scratch_volume = await t.user.volume(scratch["volume_id"])
    assert scratch_volume["scratch"] and scratch_volume["size_bytes"] == 10 ** 9
    scratch_path = subvolume(platform, t.id, scratch["volume_id"])
    assert scratch_path.is_dir()
    before = await asyncio.to_thread(qgroups, platform.storage.root)

    for x in (writer, reader):
        await t.user.release(x["id"])
        await t.user.wait_state(x["id"], "RELEASED", timeout=30)
    await t.user.wait_volume(scratch["volume_id"], "deleted", timeout=30)
    assert not scratch_path.exists(), "the scratch subvolume is destroyed on release"
    after = await asyncio.to_thread(qgroups, platform.storage.root)
    assert len(before - after) == 1, (before, after)   # its qgroup too, and no other
    for x in (writer, reader):
        assert not namespace_file(platform.storage.node_state, x["id"]).exists()


async def test_a_deleted_volumes_data_is_unreadable_from_any_new_volume(platform, make_tenant):
    t = await make_tenant()
    old = await available(t.user, "secret", 8 * MIB)
    alloc = await active(t.user, "writer", volumes=[{"volume_id": old["id"]}])
    pattern = uuid.uuid4().hex
    out = await asyncio.to_thread(in_slot, platform, alloc["id"],
                                  f"for i in $(seq 2000); do echo {pattern}; done >/mnt/secret/data && sync")
    assert out.returncode == 0, out
    await t.user.release(alloc["id"])
    await t.user.wait_state(alloc["id"], "RELEASED", timeout=30)
    await t.user.delete_volume(old["id"])
    await t.user.wait_volume(old["id"], "deleted", timeout=30)
    assert not subvolume(platform, t.id, old["id"]).exists()

    new = await available(t.user, "secret", 8 * MIB)
    path = subvolume(platform, t.id, new["id"])
    assert list(path.iterdir()) == []
    # nothing anywhere on the storage file system still holds the pattern (the old subvolume is gone)
    found = subprocess.run(["grep", "-rl", pattern, str(platform.storage.root / "tenants")], capture_output=True,
                           text=True)
    assert found.stdout == "", found.stdout
