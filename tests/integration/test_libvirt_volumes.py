"""Tenant volumes in VM slices against a real libvirtd, QEMU (TCG), virtiofsd, the project's guest image and a real
btrfs file system with qgroup limits: the guest mounts each volume at /mnt/<name> at boot (from its NoCloud
seed), the 50 MB limit holds inside it (EDQUOT), a read-only volume stays read-only even when the guest remounts
it read-write (the host shares a read-only view), a volume attached live is mounted by its tag, and a deprovision
leaves no virtiofsd and no view. One guest boots here (each boot costs seconds under TCG); the tests talk to it
through the root shell its init keeps on ttyS1 (tests.support.guest.GuestShell)."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from services.node_agent.adapters.discovery.sim import discover_sim
from services.node_agent.adapters.drivers import DriverError
from services.node_agent.adapters.drivers.libvirt.config import LibvirtConfig
from services.node_agent.adapters.drivers.libvirt.driver import LibvirtDriver
from services.node_agent.adapters.drivers.volumes import VolumeConfig, mounted_at
from services.node_agent.domain.vm.cloudinit import GuestMount, Seed, user_data
from services.node_agent.domain.volumes import Volume
from services.storage.adapters.backends.base import VolumeSpec
from services.storage.adapters.backends.btrfs import BtrfsBackend
from tests.support import vm
from tests.support.guest import GuestShell
from tests.support.polling import eventually
from tooling.guest_image import build

pytestmark = [pytest.mark.root, pytest.mark.timeout(600),
              pytest.mark.skipif(os.geteuid() != 0, reason="a system libvirtd, mounts and btrfs need root")]

MiB = 1 << 20
NODE_NAME = "libvirt-volumes-test"


@pytest.fixture(scope="module", autouse=True)
async def clean_streams():
    """No bus here (the package's fixture would purge the streams)."""
    yield


@pytest.fixture(scope="module")
async def image():
    return await asyncio.to_thread(vm.host_ready)


@pytest.fixture(scope="module")
def fs_root(btrfs_pool) -> Path:
    """The session's btrfs file system with quotas (tests/integration/conftest.py)."""
    return btrfs_pool.root


@pytest.fixture
def driver(tmp_path, fs_root) -> LibvirtDriver:
    d = LibvirtDriver(LibvirtConfig(uri=vm.URI, domain_type="qemu", passthrough=False, state_dir=tmp_path / "instances",
                                    sim_memory_mib=192), VolumeConfig((fs_root,), tmp_path / "volume-state"))
    d.bind(uuid.uuid4(), lambda: discover_sim(NODE_NAME))
    return d


async def make_volume(fs_root: Path, name: str, mode: str = "rw", size_mib: int = 50) -> Volume:
    export = await BtrfsBackend(fs_root).create(VolumeSpec(uuid.uuid4(), uuid.uuid4(), name, size_mib * MiB))
    return Volume.of(export.volume_id, name, mode, "btrfs", export.source)


async def answering(guest: GuestShell) -> GuestShell:
    """The guest's shell once it answers: it starts after the ready line, and what is typed before it reads the
    serial port may be lost (a command cut short times out; the next one clears the line first)."""
    async def probe():
        try:
            return await guest.arun("echo ready", timeout=5)
        except TimeoutError:
            return None
    await eventually(probe, until=lambda r: r == (0, "ready\n"), timeout=60, interval=0.2, what="the guest's shell")
    return guest


def virtiofsd_sharing(*paths: str) -> list[str]:
    """The command lines of running virtiofsd processes sharing one of ``paths``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "virtiofsd" in cmd and any(p in cmd for p in paths):
            found.append(cmd)
    return found


async def test_a_guest_mounts_its_volumes_at_boot_within_their_quota_and_read_only_where_asked(driver, image, fs_root,
                                                                                                tmp_path):
    data, ref, late = (await make_volume(fs_root, "data"), await make_volume(fs_root, "ref", "ro"),
                       await make_volume(fs_root, "late"))
    Path(ref.source, "readme").write_text("reference data\n")
    spec = dataclasses.replace(vm.instance_spec(image, driver.node_id, NODE_NAME), volumes=(data, ref))
    views = tmp_path / "volume-state" / "views"
    try:
        await driver.provision(spec)
        mounts = (await driver.instance_info(spec.allocation_id))["mounts"]
        assert [(m["mount_point"], m["mode"], m["via"], m["tag"]) for m in mounts] == [
            ("/mnt/data", "rw", "virtiofs", data.tag), ("/mnt/ref", "ro", "virtiofs", ref.tag)]
        with GuestShell(driver.socket_of(spec.allocation_id)) as guest:
            await answering(guest)
            status, out = await guest.arun("grep virtiofs /proc/mounts")
            assert status == 0 and f"{data.tag} /mnt/data virtiofs rw" in out, out
            assert f"{ref.tag} /mnt/ref virtiofs ro" in out, out
            # the qgroup limit holds inside the guest (df there shows the whole file system, not the limit)
            status, out = await guest.arun("dd if=/dev/urandom of=/mnt/data/big bs=1M count=80 conv=fsync", timeout=120)
            assert status != 0 and ("Disk quota exceeded" in out or "No space left on device" in out), out
            assert 40 * MiB < Path(data.source, "big").stat().st_size <= 50 * MiB
            # read-only: refused by the guest's mount, and by the host when the guest remounts it read-write
            assert await guest.arun("cat /mnt/ref/readme") == (0, "reference data\n")
            status, out = await guest.arun("echo x > /mnt/ref/new")
            assert status != 0 and "Read-only file system" in out
            status, out = await guest.arun("mount -o remount,rw /mnt/ref && echo x > /mnt/ref/new")
            assert status != 0 and "Read-only file system" in out, out
            assert not Path(ref.source, "new").exists()

            # a volume attached live: the guest is not told; its tenant mounts it by the tag in the Mount
            mounted = await driver.mount(spec.allocation_id, late)
            assert (mounted.via, mounted.tag, mounted.mount_point) == ("virtiofs", late.tag, "/mnt/late")
            await eventually(lambda: guest.arun(f"mkdir -p /mnt/late && mount -t virtiofs {late.tag} /mnt/late"),
                             until=lambda r: r[0] == 0, timeout=60, interval=0.5, what="the hotplugged tag to mount")
            assert await guest.arun("echo live > /mnt/late/f && cat /mnt/late/f") == (0, "live\n")
            assert Path(late.source, "f").read_text() == "live\n"
            assert await guest.arun("umount /mnt/late") == (0, "")
            assert await driver.unmount(spec.allocation_id, late.volume_id) is True
            await eventually(lambda: virtiofsd_sharing(late.source), until=lambda found: not found, timeout=30,
                             what="the detached volume's virtiofsd to end")
            assert late.volume_id not in {m.volume_id for m in driver.mount_table(spec.allocation_id).all()}
            assert virtiofsd_sharing(data.source), "the other volumes stay shared"
    finally:
        await driver.deprovision(spec.allocation_id)
    await eventually(lambda: virtiofsd_sharing(data.source, ref.source, str(views)), until=lambda found: not found,
                     timeout=30, what="no virtiofsd of the allocation left")
    assert not mounted_at(views / str(spec.allocation_id) / str(ref.volume_id))
    assert not (views / str(spec.allocation_id)).exists()
    assert await asyncio.to_thread(vm.leftovers, spec.allocation_id, tmp_path / "instances") == []


async def test_a_source_outside_the_volume_roots_fails_the_provision_and_leaves_nothing(driver, image, fs_root,
                                                                                       tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    vol = dataclasses.replace(await make_volume(fs_root, "data"), source=str(outside))
    spec = dataclasses.replace(vm.instance_spec(image, driver.node_id, NODE_NAME), volumes=(vol,))
    with pytest.raises(DriverError, match="is not below a volume root of this node"):
        await driver.provision(spec)
    assert await asyncio.to_thread(vm.leftovers, spec.allocation_id, tmp_path / "instances") == []
    with pytest.raises(DriverError, match="no instance of allocation"):
        await driver.mount(spec.allocation_id, vol)


# -- the guest init's side, on the host (busybox sh, mount and mkdir stubbed) ----------------------------------
def init_functions(*names: str) -> str:
    """The shell functions ``names`` as the guest's init defines them (each ends with a line holding "}")."""
    lines = build.INIT.read_text().splitlines()
    out = []
    for name in names:
        start = next(i for i, line in enumerate(lines) if line.startswith(f"{name}() {{"))
        out += lines[start:next(i for i in range(start, len(lines)) if lines[i] == "}") + 1]
    return "\n".join(out) + "\n"


def run_mount_volumes(tmp_path: Path, mount_status: int) -> subprocess.CompletedProcess:
    seed = Seed("i-vol", "vol-vm", ("ssh-ed25519 AAAAkey a@b",), "52:54:00:00:00:07", "10.0.0.7", 24, "10.0.0.1",
                mounts=(GuestMount("tv-0123abcd4567", "/mnt/data"), GuestMount("tv-89ab", "/mnt/ref", read_only=True)),
                phone_home="http://10.0.0.1:8080/ready")
    (tmp_path / "user-data").write_text(user_data(seed))
    stubs = ('fail() { echo "TESSERA-FAILED reason=$*"; exit 3; }\n'
             f'mkdir() {{ echo "mkdir $*"; }}\nmount() {{ echo "mount $*"; return {mount_status}; }}\n')
    script = init_functions("guest_mounts", "mount_volumes") + stubs + "mount_volumes user-data; echo done\n"
    return subprocess.run(["busybox", "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)


def test_the_guest_init_mounts_each_volume_of_the_seed_read_only_where_asked(tmp_path):
    proc = run_mount_volumes(tmp_path, 0)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["mkdir -p /mnt/data", "mount -t virtiofs tv-0123abcd4567 /mnt/data",
                                        "mkdir -p /mnt/ref", "mount -t virtiofs -o ro tv-89ab /mnt/ref", "done"]


def test_a_volume_the_guest_cannot_mount_fails_its_boot_naming_it(tmp_path):
    proc = run_mount_volumes(tmp_path, 32)
    assert proc.returncode == 3
    assert proc.stdout.splitlines()[-1] == "TESSERA-FAILED reason=cannot-mount-tv-0123abcd4567-at-/mnt/data"
