"""The btrfs backend against a real btrfs file system with quotas, made in a loop file under tmp_path (one per
module; always unmounted and its loop device detached in teardown). Needs root and btrfs-progs."""
from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from services.storage.adapters.backends.base import BackendError, VolumeSpec
from services.storage.adapters.backends.btrfs import BtrfsBackend, ensure_loop_filesystem, run_command, unmount_loop_filesystem
from shared.settings import SettingError

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0, reason="btrfs tests need root (loop devices, mount, qgroups)")]

MiB = 1 << 20
PATTERN = b"TESSERA-BTRFS-TENANT-DATA-"


@pytest.fixture(scope="module", autouse=True)
def clean_streams():
    """Overrides the integration suite's stream purge: nothing here uses the bus (no NATS, no PostgreSQL)."""
    yield


@pytest.fixture(scope="module")
def fs_root(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("btrfs")
    mount_point = work / "mnt"
    try:
        yield ensure_loop_filesystem(work / "pool.img", mount_point, 512 * MiB)
    finally:
        unmount_loop_filesystem(mount_point)


@pytest.fixture
def backend(fs_root) -> BtrfsBackend:
    return BtrfsBackend(fs_root)


def spec(size_mib: int, tenant: uuid.UUID | None = None) -> VolumeSpec:
    return VolumeSpec(uuid.uuid4(), tenant or uuid.uuid4(), "scratch", size_mib * MiB)


def write(path: Path, size: int, chunk: bytes | None = None, *, fsync: bool = True) -> None:
    """``size`` bytes (incompressible unless ``chunk`` is given) into ``path``, appended; raises OSError."""
    with open(path, "ab") as f:
        for _ in range(size // MiB):
            f.write(chunk or os.urandom(MiB))
            f.flush()
            if fsync:
                os.fsync(f.fileno())


def qgroups(root: Path) -> str:
    return subprocess.run(["btrfs", "qgroup", "show", "--raw", str(root)], check=True, capture_output=True,
                          text=True).stdout


def qgroup_ids(root: Path) -> set[str]:
    return {line.split()[0] for line in qgroups(root).splitlines()[2:] if line.strip()}


def inode(path: Path) -> int:
    return path.stat().st_ino


async def test_volumes_of_two_tenants_are_limited_subvolumes_in_private_tenant_folders(backend, fs_root):
    a, b = spec(20), spec(30)
    ea, eb = await backend.create(a), await backend.create(b)
    for s, e in ((a, ea), (b, eb)):
        path = fs_root / "tenants" / str(s.tenant_id) / str(s.volume_id)
        assert e.source == str(path) and e.backend == "btrfs" and e.volume_id == s.volume_id
        assert inode(path) == 256                                        # a subvolume's root directory
        assert (path.parent.stat().st_mode & 0o777) == 0o700
        assert e.options["subvolid"] == (await run_command(["btrfs", "inspect-internal", "rootid", str(path)], 10)).strip()
        assert (await backend.usage(s.volume_id)).limit_bytes == s.size_bytes
    assert "scratch" not in {p.name for p in (fs_root / "tenants").rglob("*")}   # the name never becomes a path


async def test_a_write_within_the_limit_fits_and_one_past_it_fails_with_edquot(backend):
    s = spec(20)
    path = Path((await backend.create(s)).source)
    write(path / "fits", 12 * MiB)
    with pytest.raises(OSError) as failed:
        write(path / "too-much", 20 * MiB)
    assert failed.value.errno in (errno.EDQUOT, errno.ENOSPC)


async def test_usage_counts_the_bytes_written_even_before_a_commit(backend):
    s = spec(40)
    path = Path((await backend.create(s)).source)
    empty = await backend.usage(s.volume_id)
    write(path / "a", 6 * MiB)
    write(path / "b", 5 * MiB, fsync=False)                 # not even fsynced: usage commits before it reads
    used = (await backend.usage(s.volume_id)).used_bytes - empty.used_bytes
    # Referenced bytes are the data extents exactly (random data: no compression, sizes 4 KiB aligned) plus the
    # subvolume's own tree blocks (16 KiB nodes: inode, extent and checksum items of two files fit in a few).
    assert 11 * MiB <= used <= 11 * MiB + 256 * 1024, used
    assert empty.limit_bytes == 40 * MiB


async def test_resize_grows_the_limit_and_a_write_past_the_old_limit_then_fits(backend):
    s = spec(16)
    path = Path((await backend.create(s)).source)
    write(path / "a", 12 * MiB)
    await backend.resize(s.volume_id, 48 * MiB)
    write(path / "b", 24 * MiB)                             # 36 MiB in all: over the old 16 MiB
    usage = await backend.usage(s.volume_id)
    assert usage.limit_bytes == 48 * MiB and usage.used_bytes >= 36 * MiB


async def test_shrinking_and_resizing_an_unknown_volume_are_refused(backend):
    s = spec(32)
    await backend.create(s)
    with pytest.raises(BackendError, match="cannot shrink"):
        await backend.resize(s.volume_id, 16 * MiB)
    await backend.resize(s.volume_id, 32 * MiB)                # the same size: nothing to do
    assert (await backend.usage(s.volume_id)).limit_bytes == 32 * MiB
    with pytest.raises(BackendError, match="does not exist"):
        await backend.resize(uuid.uuid4(), 64 * MiB)
    with pytest.raises(BackendError, match="does not exist"):
        await backend.usage(uuid.uuid4())


async def test_delete_removes_the_subvolume_its_qgroup_and_its_exports_file(backend, fs_root):
    s = spec(20)
    export = await backend.create(s)
    await backend.allow(s.volume_id, ("10.1.0.2",), read_only=False)
    write(Path(export.source) / "data", 4 * MiB)
    qgroup = f"0/{export.options['subvolid']}"
    assert qgroup in qgroup_ids(fs_root)
    await backend.delete(s.volume_id)
    assert not Path(export.source).exists()
    assert qgroup not in qgroup_ids(fs_root)
    assert not (fs_root / ".tessera" / "exports" / f"{s.volume_id}.json").exists()
    await backend.delete(s.volume_id)                          # idempotent
    await backend.delete(uuid.uuid4())


async def test_a_new_volume_never_sees_a_deleted_volumes_data(backend, fs_root):
    tenant = uuid.uuid4()
    old = spec(64, tenant)
    old_path = Path((await backend.create(old)).source)
    write(old_path / "secret", 32 * MiB, (PATTERN * (MiB // len(PATTERN) + 1))[:MiB])
    await backend.delete(old.volume_id)
    assert not old_path.exists()
    # a new volume of the same tenant, and one made again under the deleted id
    for new in (spec(64, tenant), VolumeSpec(old.volume_id, tenant, "again", 64 * MiB)):
        path = Path((await backend.create(new)).source)
        assert list(path.iterdir()) == []
        probe = path / "probe"
        with open(probe, "wb") as f:                           # allocated, never written: must read as zeros
            os.posix_fallocate(f.fileno(), 0, 48 * MiB)
        with open(probe, "rb") as f:
            while block := f.read(4 * MiB):
                assert PATTERN not in block and block.count(0) == len(block)
        await backend.delete(new.volume_id)


async def test_create_is_idempotent_and_keeps_the_data(backend, fs_root):
    s = spec(20)
    first = await backend.create(s)
    write(Path(first.source) / "kept", 2 * MiB)
    again = await backend.create(s)
    assert again == first and (Path(again.source) / "kept").stat().st_size == 2 * MiB
    await backend.resize(s.volume_id, 40 * MiB)
    await backend.create(s)                                    # a redelivered create does not undo the growth
    assert (await backend.usage(s.volume_id)).limit_bytes == 40 * MiB
    # a create that stopped between the subvolume and its limit: made again, it sets the limit
    half = spec(24)
    path = fs_root / "tenants" / str(half.tenant_id) / str(half.volume_id)
    path.parent.mkdir(parents=True)
    await run_command(["btrfs", "subvolume", "create", str(path)], 10)
    await backend.create(half)
    assert (await backend.usage(half.volume_id)).limit_bytes == 24 * MiB
    with pytest.raises(BackendError, match="another tenant"):
        await backend.create(VolumeSpec(s.volume_id, uuid.uuid4(), "other", 20 * MiB))


async def test_allow_records_exactly_the_clients_and_revoke_takes_them_off(backend, fs_root):
    s = spec(20)
    export = await backend.create(s)
    record = fs_root / ".tessera" / "exports" / f"{s.volume_id}.json"
    await backend.allow(s.volume_id, ("10.1.0.3", "10.1.0.2"), read_only=True)
    assert json.loads(record.read_text()) == {"volume_id": str(s.volume_id), "source": export.source,
                                              "clients": {"10.1.0.2": "ro", "10.1.0.3": "ro"}}
    # a shared volume's slots keep their own modes side by side; allowing a client again sets its mode
    await backend.allow(s.volume_id, ("10.1.0.4", "10.1.0.3"), read_only=False)
    assert json.loads(record.read_text())["clients"] == {"10.1.0.2": "ro", "10.1.0.3": "rw", "10.1.0.4": "rw"}
    await backend.revoke(s.volume_id, ("10.1.0.2",))
    await backend.revoke(s.volume_id, ("10.1.0.3", "10.9.9.9"))
    await backend.revoke(s.volume_id, ("10.1.0.3",))                 # idempotent
    assert json.loads(record.read_text()) == {"volume_id": str(s.volume_id), "source": export.source,
                                              "clients": {"10.1.0.4": "rw"}}
    assert [p.name for p in record.parent.iterdir()] == [record.name]  # no temporary file left behind
    await backend.revoke(uuid.uuid4(), ("10.1.0.4",))                # no record: nothing to do
    with pytest.raises(BackendError, match="does not exist"):
        await backend.allow(uuid.uuid4(), ("10.1.0.4",), read_only=True)


async def test_a_file_system_without_quotas_is_refused_and_ensure_keeps_an_existing_image(tmp_path, monkeypatch):
    image, mount_point = tmp_path / "plain.img", tmp_path / "plain"
    try:
        root = ensure_loop_filesystem(image, mount_point, 160 * MiB)
        assert ensure_loop_filesystem(image, mount_point, 160 * MiB) == root      # mounted: nothing to do
        await run_command(["btrfs", "quota", "disable", str(root)], 30)
        backend = BtrfsBackend(root)
        with pytest.raises(BackendError, match=f"quotas are not enabled on the btrfs file system at {root}"):
            await backend.create(spec(20))
        assert not (root / "tenants").exists()
        # past that check (quotas turned off meanwhile), the limit fails and the new subvolume goes again
        monkeypatch.setattr(backend, "_require_quotas", lambda: asyncio.sleep(0))
        lost = spec(20)
        with pytest.raises(BackendError, match="^qgroup limit cannot be set: .*quota not enabled"):
            await backend.create(lost)
        assert list((root / "tenants" / str(lost.tenant_id)).iterdir()) == []
        (root / "marker").write_bytes(b"kept")
        unmount_loop_filesystem(mount_point)
        assert not os.path.ismount(mount_point)
        ensure_loop_filesystem(image, mount_point, 160 * MiB)                     # the same file system again
        assert (root / "marker").read_bytes() == b"kept"
        await backend.create(spec(20))                                            # quotas enabled by ensure
    finally:
        unmount_loop_filesystem(mount_point)
    unmount_loop_filesystem(mount_point)                                          # nothing mounted: nothing to do
    backing = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True).stdout
    assert backing == ""


async def test_a_failing_command_quotes_its_stderr_and_enospc_reads_file_system_full():
    with pytest.raises(BackendError, match=r"failed: boom; second line$"):
        await run_command(["sh", "-c", "echo '  boom' >&2; echo 'second line  ' >&2; exit 3"], 10)
    with pytest.raises(BackendError, match="^file system full: .*No space left on device"):
        await run_command(["sh", "-c", "echo 'ERROR: cannot create subvolume: No space left on device' >&2; exit 1"], 10)
    with pytest.raises(TimeoutError, match="did not finish in 0.2s"):
        await run_command(["sleep", "30"], 0.2)


def test_from_env_requires_an_absolute_mount_point():
    assert BtrfsBackend.from_env({"TESSERA_BTRFS_ROOT": "/srv/tessera"}).root == Path("/srv/tessera")
    for bad in ({}, {"TESSERA_BTRFS_ROOT": ""}, {"TESSERA_BTRFS_ROOT": "relative/dir"}):
        with pytest.raises(SettingError, match="TESSERA_BTRFS_ROOT"):
            BtrfsBackend.from_env(bad)
