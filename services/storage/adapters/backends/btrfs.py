"""The real ``btrfs`` backend: a tenant volume is a subvolume with a qgroup limit on the storage host's file system.

Layout under the file system's mount point ``root``::

    tenants/<tenant id>/            plain directory, mode 0700
    tenants/<tenant id>/<volume id> the volume: a subvolume, its own qgroup 0/<subvolid> carries the limit
    .tessera/exports/<volume id>.json  who may mount it (btrfs has no network access list of its own)

Volume ids are UUIDs, so nothing a tenant chooses (the volume's name is metadata only) ever becomes a path. The
backend finds a volume by its id alone (the interface passes no tenant): one directory scan of ``tenants/``.

Every ``btrfs`` command runs as an asyncio subprocess under a timeout (``TimeoutError`` past it: transient, the
caller retries; every operation is idempotent). A command that fails raises ``BackendError`` quoting its trimmed
stderr, "file system full: ..." when it says ENOSPC. Operations on one volume are not serialised here: the
storage service sends one command per volume at a time.

Needs the Debian package ``btrfs-progs`` (``btrfs``, ``mkfs.btrfs``), root, and quotas enabled on the file system
(``ensure_loop_filesystem`` enables them on the loop file system it makes for a host without a device).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from shared.files import replace_atomically
from shared.settings import SettingError

from .base import BackendError, Export, StorageBackend, Usage, VolumeSpec

SUBVOLUME_INODE = 256              # BTRFS_FIRST_FREE_OBJECTID: the root directory of every subvolume has it
_ENV = {"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}


class CommandFailed(BackendError):
    """A command exited non-zero; ``stderr`` is its trimmed error output."""

    def __init__(self, message: str, stderr: str):
        super().__init__(message)
        self.stderr = stderr


def _trim(text: str, limit: int = 400) -> str:
    one_line = "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return one_line if len(one_line) <= limit else "…" + one_line[-limit:]


def _failure(argv: list[str], stderr: str) -> CommandFailed:
    said = _trim(stderr) or "no error output"
    if "No space left on device" in stderr:
        return CommandFailed(f"file system full: `{' '.join(argv)}`: {said}", said)
    return CommandFailed(f"`{' '.join(argv)}` failed: {said}", said)


async def run_command(argv: list[str], timeout_s: float) -> str:
    """Run ``argv`` and return its stdout. Raises CommandFailed (a BackendError quoting stderr; "file system
    full: ..." for ENOSPC) when it exits non-zero, TimeoutError (after killing it) past ``timeout_s``."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=_ENV)
    try:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that arrives as the command
        # ends, and a cancelled caller (a service stopping) would then run on
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise TimeoutError(f"`{' '.join(argv)}` did not finish in {timeout_s:g}s") from None
    if proc.returncode != 0:
        raise _failure(argv, err.decode(errors="replace"))
    return out.decode(errors="replace")


def _parse_qgroups(text: str) -> dict[str, tuple[int, int, int | None]]:
    """``btrfs qgroup show -re --raw`` → {qgroupid: (referenced, exclusive, max referenced or None)}."""
    rows = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 5 and "/" in cells[0] and cells[1].isdigit():
            rows[cells[0]] = (int(cells[1]), int(cells[2]), None if cells[3] == "none" else int(cells[3]))
    return rows


def _write_atomically(path: Path, document: dict) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    replace_atomically(path, lambda f: json.dump(document, f, indent=1, sort_keys=True))
    dirfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


class BtrfsBackend(StorageBackend):
    """Tenant volumes as btrfs subvolumes with qgroup limits under ``root`` (a btrfs mount point with quotas)."""

    name: ClassVar[str] = "btrfs"

    def __init__(self, root: Path, *, command_timeout_s: float = 60.0, drop_timeout_s: float = 300.0):
        self.root = Path(root)
        self.command_timeout_s = command_timeout_s
        self.drop_timeout_s = drop_timeout_s       # how long delete waits for the kernel to drop a subvolume

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BtrfsBackend:
        """From TESSERA_BTRFS_ROOT (required: the absolute mount point of the btrfs file system). No I/O."""
        env = os.environ if environ is None else environ
        raw = (env.get("TESSERA_BTRFS_ROOT") or "").strip()
        if not raw or not os.path.isabs(raw):
            raise SettingError(f"TESSERA_BTRFS_ROOT={raw!r} is not the absolute mount point of a btrfs file system")
        return cls(Path(raw))

    # -- paths ------------------------------------------------------------------------------------------------
    def _tenant_dir(self, tenant_id: uuid.UUID) -> Path:
        return self.root / "tenants" / str(tenant_id)

    def _exports_file(self, volume_id: uuid.UUID) -> Path:
        return self.root / ".tessera" / "exports" / f"{volume_id}.json"

    def _find_blocking(self, volume_id: uuid.UUID) -> Path | None:
        tenants = self.root / "tenants"
        if not tenants.is_dir():
            return None
        found = [p for t in os.scandir(tenants) if t.is_dir(follow_symlinks=False)
                 if (p := Path(t.path) / str(volume_id)).exists()]
        if len(found) > 1:
            raise BackendError(f"volume {volume_id} exists under several tenants: {', '.join(map(str, found))}")
        return found[0] if found else None

    async def _find(self, volume_id: uuid.UUID) -> Path | None:
        return await asyncio.to_thread(self._find_blocking, volume_id)

    async def _existing(self, volume_id: uuid.UUID) -> Path:
        path = await self._find(volume_id)
        if path is None:
            raise BackendError(f"volume {volume_id} does not exist on the btrfs file system at {self.root}")
        return path

    # -- commands ---------------------------------------------------------------------------------------------
    async def _btrfs(self, *args: str | Path, timeout_s: float | None = None) -> str:
        return await run_command(["btrfs", *map(str, args)], timeout_s or self.command_timeout_s)

    async def _subvolid(self, path: Path) -> int:
        return int((await self._btrfs("inspect-internal", "rootid", path)).strip())

    async def _qgroup(self, path: Path, subvolid: int, *, fresh: bool = False) -> tuple[int, int, int | None]:
        """(referenced, exclusive, referenced limit) of the subvolume's own qgroup; ``fresh`` commits first."""
        out = await self._btrfs("qgroup", "show", "-re", "--raw", *(["--sync"] if fresh else []), "-f", path)
        row = _parse_qgroups(out).get(f"0/{subvolid}")
        if row is None:
            raise BackendError(f"subvolume {path} has no qgroup 0/{subvolid}")
        return row

    async def _require_quotas(self) -> None:
        try:
            await self._btrfs("qgroup", "show", "-f", self.root)
        except CommandFailed as e:
            if "not enabled" in e.stderr:
                raise BackendError(f"quotas are not enabled on the btrfs file system at {self.root} "
                                   f"(`btrfs quota enable {self.root}`): {e.stderr}") from None
            raise

    async def _limit(self, path: Path, size_bytes: int) -> None:
        await self._btrfs("qgroup", "limit", str(size_bytes), path)

    # -- the interface ----------------------------------------------------------------------------------------
    async def create(self, spec: VolumeSpec) -> Export:
        """Make ``tenants/<tenant>/<volume>`` with its qgroup limit. Idempotent: an existing subvolume of that id
        keeps its data and gets the limit set again, unless it already has a larger one (it was grown since).
        Raises BackendError when quotas are off, the limit cannot be set (the new subvolume is deleted again),
        the id belongs to another tenant, or the file system is full."""
        if spec.size_bytes <= 0:
            raise BackendError(f"volume {spec.volume_id}: size {spec.size_bytes} is not a positive number of bytes")
        await self._require_quotas()
        path = self._tenant_dir(spec.tenant_id) / str(spec.volume_id)
        found = await self._find(spec.volume_id)
        if found is not None and found != path:
            raise BackendError(f"volume {spec.volume_id} already exists for another tenant ({found.parent.name})")
        made = found is None
        if made:
            await asyncio.to_thread(self._make_tenant_dir, spec.tenant_id)
            await self._btrfs("subvolume", "create", path)
        elif (await asyncio.to_thread(os.stat, path)).st_ino != SUBVOLUME_INODE:
            raise BackendError(f"{path} exists but is not a btrfs subvolume")
        subvolid = await self._subvolid(path)
        try:
            current = None if made else (await self._qgroup(path, subvolid))[2]
            if current is None or current < spec.size_bytes:
                await self._limit(path, spec.size_bytes)
        except (BackendError, TimeoutError) as e:
            if made:              # best effort: a subvolume left without a limit gets one from the next create
                with contextlib.suppress(BackendError, TimeoutError):
                    await self._btrfs("subvolume", "delete", "--commit-after", path)
            raise BackendError(f"qgroup limit cannot be set: {e}") from e
        return Export(spec.volume_id, self.name, str(path), {"subvolid": str(subvolid)})

    def _make_tenant_dir(self, tenant_id: uuid.UUID) -> None:
        folder = self._tenant_dir(tenant_id)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder.parent, 0o700)
        os.chmod(folder, 0o700)

    async def resize(self, volume_id: uuid.UUID, size_bytes: int) -> None:
        """Grow the limit to ``size_bytes`` (the same size again: nothing to do). Raises BackendError for an
        unknown volume or a size below the current limit (btrfs would accept it: the data might not fit)."""
        path = await self._existing(volume_id)
        _, _, current = await self._qgroup(path, await self._subvolid(path))
        if current is not None and size_bytes < current:
            raise BackendError(f"volume {volume_id} cannot shrink from {current} to {size_bytes} bytes")
        if current != size_bytes:
            await self._limit(path, size_bytes)

    async def delete(self, volume_id: uuid.UUID) -> None:
        """Delete the subvolume (committed), wait until the kernel has dropped it, then its qgroup and its
        exports file. Idempotent: an unknown volume is nothing to do.

        Recent kernels (6.18 on the test host) remove a dropped subvolume's qgroup themselves, older ones leave it
        behind, and until the drop ends ``qgroup destroy`` answers EBUSY: hence the wait for the drop (``btrfs
        subvolume sync``, bounded by ``drop_timeout_s``; TimeoutError past it, and a retry finds the subvolume gone
        and its data unreachable) before destroying what is left (ENOENT: nothing was). The delete commits
        (``--commit-after``): the cleaner drops a subvolume only after a commit, so without it the wait lasts until
        the next periodic commit (30 s by default); with it, a small volume's delete takes ~15 ms.
        A later volume never sees this one's data: a new subvolume is empty, unwritten extents read as zeros."""
        path = await self._find(volume_id)
        if path is not None:
            subvolid = await self._subvolid(path)
            await self._btrfs("subvolume", "delete", "--commit-after", path)
            await self._btrfs("subvolume", "sync", self.root, str(subvolid), timeout_s=self.drop_timeout_s)
            try:
                await self._btrfs("qgroup", "destroy", f"0/{subvolid}", self.root)
            except CommandFailed as e:
                if "No such file or directory" not in e.stderr:      # ENOENT: the kernel removed it already
                    raise
        await asyncio.to_thread(self._exports_file(volume_id).unlink, missing_ok=True)

    async def usage(self, volume_id: uuid.UUID) -> Usage:
        """The subvolume's qgroup: ``used_bytes`` is *referenced*, the figure the limit is set on (``qgroup limit``
        limits referenced bytes), so used and limit compare; with no snapshots or reflinks out of the volume it
        equals exclusive. It counts data extents plus the subvolume's own tree blocks (16 KiB each).

        Staleness: btrfs updates qgroup numbers when a transaction commits (every 30 s by default; an fsync goes
        to the log tree and does not commit), so this reads with ``--sync`` (one commit: current numbers, a few
        ms). No rescan is needed while quotas stay enabled; only qgroups the kernel marks inconsistent (quotas
        enabled over existing data, or an accounting error) need ``btrfs quota rescan -w``, which this does not
        run (it can take minutes on a large file system). Raises BackendError for an unknown volume."""
        path = await self._existing(volume_id)
        referenced, _, limit = await self._qgroup(path, await self._subvolid(path), fresh=True)
        if limit is None:
            raise BackendError(f"volume {volume_id} has no limit (its create did not finish): create it again")
        return Usage(used_bytes=referenced, limit_bytes=limit)

    async def allow(self, volume_id: uuid.UUID, clients: tuple[str, ...], read_only: bool) -> None:
        """Record each of ``clients`` with its mode (``rw`` or ``ro``) in ``.tessera/exports/<volume id>.json``
        (written atomically), for the node-agent side to check: a shared volume's slots keep their own modes side
        by side; allowing a client again sets its mode. Raises BackendError for an unknown volume."""
        path = await self._existing(volume_id)
        await asyncio.to_thread(self._allow_blocking, volume_id, path, frozenset(clients), read_only)

    def _allow_blocking(self, volume_id: uuid.UUID, path: Path, clients: frozenset[str], read_only: bool) -> None:
        file = self._exports_file(volume_id)
        try:
            kept = json.loads(file.read_text()).get("clients", {})
        except FileNotFoundError:
            kept = {}
        merged = {**kept, **dict.fromkeys(clients, "ro" if read_only else "rw")}
        _write_atomically(file, {"volume_id": str(volume_id), "source": str(path), "clients": dict(sorted(merged.items()))})

    async def revoke(self, volume_id: uuid.UUID, clients: tuple[str, ...]) -> None:
        """Take ``clients`` off the recorded list (idempotent: no record, or clients not on it, change nothing)."""
        await asyncio.to_thread(self._revoke_blocking, volume_id, frozenset(clients))

    def _revoke_blocking(self, volume_id: uuid.UUID, clients: frozenset[str]) -> None:
        file = self._exports_file(volume_id)
        try:
            document = json.loads(file.read_text())
        except FileNotFoundError:
            return
        kept = {c: mode for c, mode in document["clients"].items() if c not in clients}
        if kept != document["clients"]:
            _write_atomically(file, {**document, "clients": kept})


# -- a loop file system for a host with no device configured (blocking: call through asyncio.to_thread) ------------
_BTRFS_MAGIC_AT, _BTRFS_MAGIC = 0x10040, b"_BHRfS_M"       # the primary superblock's magic


def _run_blocking(*argv: str | Path, timeout_s: float = 120.0) -> str:
    argv_ = [str(a) for a in argv]
    done = subprocess.run(argv_, capture_output=True, text=True, timeout=timeout_s, env=_ENV)
    if done.returncode != 0:
        raise _failure(argv_, done.stderr)
    return done.stdout


def _mount_of(mount_point: Path) -> tuple[str, str] | None:
    """(file system type, source) of what is mounted at ``mount_point``, or None."""
    target = str(mount_point.resolve())
    found = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        where = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), left.split()[4])   # \040 is a space
        if where == target:
            fstype, source = right.split()[:2]
            found = (fstype, source)                                 # the last one listed is on top
    return found


def _has_btrfs(image: Path) -> bool:
    with open(image, "rb") as f:
        f.seek(_BTRFS_MAGIC_AT)
        return f.read(len(_BTRFS_MAGIC)) == _BTRFS_MAGIC


def ensure_loop_filesystem(image: Path, mount_point: Path, size_bytes: int) -> Path:
    """A btrfs file system with quotas in the file ``image`` mounted at ``mount_point`` (returned). Makes the
    sparse image of ``size_bytes`` (mkfs.btrfs needs at least ~114 MiB) and its file system only when missing
    (an existing one keeps its data and size); mounts it through a loop device; enables quotas. Idempotent:
    already mounted there → nothing. Blocking. Raises BackendError (quoting stderr) when a command fails."""
    mounted = _mount_of(mount_point) if mount_point.exists() else None
    if mounted is not None:
        if mounted[0] != "btrfs":
            raise BackendError(f"{mount_point} is a mount point of a {mounted[0]} file system, not btrfs")
        return mount_point
    image.parent.mkdir(parents=True, exist_ok=True)
    if not image.exists():
        with open(image, "wb") as f:
            f.truncate(size_bytes)
    if not _has_btrfs(image):
        _run_blocking("mkfs.btrfs", "-q", image)
    mount_point.mkdir(parents=True, exist_ok=True)
    _run_blocking("mount", "-t", "btrfs", "-o", "loop", image, mount_point)
    _run_blocking("btrfs", "quota", "enable", mount_point)
    return mount_point


def unmount_loop_filesystem(mount_point: Path, detach_timeout_s: float = 10.0) -> None:
    """Unmount ``mount_point`` and see its loop device detached (``mount -o loop`` sets autoclear, which the
    kernel applies shortly after; a device still backing the same file then is detached here). Nothing mounted
    there → nothing. Blocking. Raises BackendError when the unmount fails (busy)."""
    mounted = _mount_of(mount_point) if mount_point.exists() else None
    if mounted is None:
        return
    device = mounted[1]
    backing = Path(f"/sys/block/{Path(device).name}/loop/backing_file")
    image = backing.read_text().strip() if device.startswith("/dev/loop") and backing.exists() else None
    _run_blocking("umount", mount_point)
    if image is None:
        return
    deadline = time.monotonic() + detach_timeout_s
    while time.monotonic() < deadline:
        try:
            if backing.read_text().strip() != image:
                return                           # detached, and perhaps attached since by someone else: not ours
        except FileNotFoundError:
            return
        time.sleep(0.05)
    subprocess.run(["losetup", "-d", device], capture_output=True, timeout=30)
