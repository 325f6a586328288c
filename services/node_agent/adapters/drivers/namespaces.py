"""Volumes in network-namespace slots (the sim driver's, the tests' slots): one persistent mount namespace per
allocation, in which each btrfs volume is bind mounted at ``/mnt/<name>``.

The namespace is kept by a bind mount of its nsfs file at ``<state>/mntns/<allocation id>``
(``namespace_file``), as ``ip netns`` keeps network namespaces under /run/netns: the directory is a private
bind mount of itself, because the kernel refuses such a file on a shared mount. A slot's processes (a test) enter
it with ``nsenter --mount=<file>``. It is made (``unshare --mount=<file> --propagation slave``) on the first
volume, never for an allocation without one: host mounts and unmounts still reach it (a storage file system
mounted later, or unmounted at the platform's stop), nothing mounted in it reaches the host. Inside, ``/mnt`` is
the allocation's own tmpfs, so a mount point made for one allocation never shows in another's namespace, and
the copies of the other allocations' namespace files are dropped from it (they would keep those namespaces, and
their mounts, alive after their deprovision).

A read-only volume is bound at a hidden staging point, remounted ``bind,ro`` there and only then moved to
``/mnt/<name>``: nothing in the slot ever sees it writable, and writes fail with EROFS. After the mount, the
directory mounted is compared (device, inode) with the source the node checked on the host.

A mount namespace is not a file-system jail: the slot's processes still see the host's tree (as the network
namespace slots share the host's files); what is the allocation's own is ``/mnt``. A detach is lazy
(``umount -l``): files a slot keeps open stay usable until closed. Deprovision unmounts every volume, the
namespace file and the record. Every operation is idempotent and blocking (subprocesses); failures raise
DriverError quoting the command's error. Needs root and util-linux (unshare, nsenter, mount).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import subprocess
import threading
import uuid
from pathlib import Path

import structlog

from ...domain.volumes import MountedVolume, Volume, simulated_mount
from .base import DriverError
from .volumes import MountTable, VolumeConfig, claim, mounted_at

log = structlog.get_logger()
_TIMEOUT_S = 30
_STAGE = "/mnt/.tessera-stage-"   # where a volume is mounted (and made read-only) before it is moved into place


def namespace_file(state_dir: Path, allocation_id: uuid.UUID | str) -> Path:
    """The file keeping the allocation's mount namespace (``nsenter --mount=<it>`` enters the slot's view)."""
    return Path(state_dir) / "mntns" / str(uuid.UUID(str(allocation_id)))


def _run(*argv: str | Path) -> str:
    argv_ = [str(a) for a in argv]
    try:
        done = subprocess.run(argv_, capture_output=True, text=True, timeout=_TIMEOUT_S,
                              env={"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DriverError(f"`{' '.join(argv_)}`: {exc}") from None
    if done.returncode != 0:
        said = "; ".join(line.strip() for line in done.stderr.splitlines() if line.strip()) or "no error output"
        raise DriverError(f"`{' '.join(argv_)}` failed: {said}")
    return done.stdout


class MountNamespaces:
    """The allocations' mount namespaces under ``config.state_dir``/mntns, and their mount records."""

    def __init__(self, config: VolumeConfig | None = None):
        self.config = config or VolumeConfig()
        self._setup = threading.Lock()

    @property
    def directory(self) -> Path:
        return self.config.state_dir / "mntns"

    def file_of(self, allocation_id: uuid.UUID) -> Path:
        return namespace_file(self.config.state_dir, allocation_id)

    def table(self, allocation_id: uuid.UUID) -> MountTable:
        return MountTable(self.directory / f"{allocation_id}.json")

    def mounts(self, allocation_id: uuid.UUID) -> list[MountedVolume]:
        return self.table(allocation_id).all()

    # -- the namespace ----------------------------------------------------------------------------------
    def _enter(self, allocation_id: uuid.UUID, *argv: str | Path) -> str:
        return _run("nsenter", f"--mount={self.file_of(allocation_id)}", "--", *argv)

    def _ensure(self, allocation_id: uuid.UUID) -> None:
        file = self.file_of(allocation_id)
        with self._setup, self._dir_lock():   # several node-agents (the lab's) may share the state directory
            self.directory.mkdir(parents=True, exist_ok=True)
            if not mounted_at(self.directory):
                _run("mount", "--bind", self.directory, self.directory)
            _run("mount", "--make-private", self.directory)
        if not mounted_at(file):
            file.touch()
            _run("unshare", f"--mount={file}", "--propagation", "slave", "true")
            log.info("node_agent.mount_namespace_made", allocation_id=str(allocation_id), file=str(file))
        try:   # each step checked, so a namespace a crash cut short is completed (never /mnt of the host used)
            if self._mounted_inside(allocation_id, self.directory):
                self._enter(allocation_id, "umount", "-l", self.directory)
            if not self._mounted_inside(allocation_id, "/mnt"):
                self._enter(allocation_id, "mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "tessera-volumes", "/mnt")
        except DriverError:
            self._drop_namespace(allocation_id)
            raise

    def _mounted_inside(self, allocation_id: uuid.UUID, path: str | Path) -> bool:
        return subprocess.run(["nsenter", f"--mount={self.file_of(allocation_id)}", "--", "mountpoint", "-q", str(path)],
                              capture_output=True, timeout=_TIMEOUT_S).returncode == 0

    @contextlib.contextmanager
    def _dir_lock(self):
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.config.state_dir / ".mntns.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)   # releases the lock

    def _drop_namespace(self, allocation_id: uuid.UUID) -> None:
        file = self.file_of(allocation_id)
        if mounted_at(file):
            try:   # the volumes first: a process left in the namespace would otherwise keep them mounted
                self._enter(allocation_id, "umount", "-l", "/mnt")
            except DriverError:
                pass   # not mounted (a namespace cut short): nothing to take away
            _run("umount", file)
        file.unlink(missing_ok=True)

    # -- volumes ----------------------------------------------------------------------------------------
    def attach_all(self, allocation_id: uuid.UUID, volumes: tuple[Volume, ...]) -> list[MountedVolume]:
        """Mount every volume (a provision); on a failure nothing of the allocation's volumes is left."""
        try:
            return [self.attach(allocation_id, v) for v in volumes]
        except BaseException:
            self.remove(allocation_id)
            raise

    def attach(self, allocation_id: uuid.UUID, volume: Volume) -> MountedVolume:
        """Mount one volume at /mnt/<name> in the allocation's namespace (made when missing); an appliance's is
        rendered only. Idempotent per volume id; DriverError when refused or when mounting fails."""
        table = self.table(allocation_id)
        mounted = claim(table, volume)
        if mounted is not None:
            return mounted
        if volume.simulated:
            mounted = simulated_mount(volume)
            log.info("node_agent.volume_mount_rendered", allocation_id=str(allocation_id), command=mounted.command)
        else:
            source = self.config.source_of(volume)
            self._ensure(allocation_id)
            self._bind(allocation_id, volume, source)
            mounted = MountedVolume(volume.volume_id, volume.name, volume.mount_point, volume.mode, "bind",
                                    source=source)
        table.put(mounted)
        return mounted

    def _bind(self, allocation_id: uuid.UUID, volume: Volume, source: str) -> None:
        checked = os.stat(source)
        stage, target = f"{_STAGE}{secrets.token_hex(6)}", volume.mount_point
        for left in self._enter(allocation_id, "ls", "-A", "/mnt").split():   # what a crash mid-mount left
            if f"/mnt/{left}".startswith(_STAGE):
                self._unmount(allocation_id, f"/mnt/{left}")
                self._enter(allocation_id, "rmdir", f"/mnt/{left}")
        try:
            self._enter(allocation_id, "mkdir", "-p", stage, target)
            self._enter(allocation_id, "mount", "--bind", source, stage)
            if volume.read_only:
                self._enter(allocation_id, "mount", "-o", "remount,bind,ro", stage)
            self._unmount(allocation_id, target)   # a mount a crash left without its record
            self._enter(allocation_id, "mount", "--move", stage, target)
            dev, ino = self._enter(allocation_id, "stat", "-c", "%d %i", target).split()
            if (int(dev), int(ino)) != (checked.st_dev, checked.st_ino):
                self._unmount(allocation_id, target)
                raise DriverError(f"volume {volume.volume_id}: the directory mounted at {target} is not the source "
                                  f"{source} checked on the host (it changed meanwhile): unmounted")
        finally:
            try:   # best effort: the staging point is hidden, and the error that got here matters more
                self._unmount(allocation_id, stage)
                self._enter(allocation_id, "rmdir", "--ignore-fail-on-non-empty", stage)
            except DriverError as exc:
                log.warning("node_agent.volume_stage_left", allocation_id=str(allocation_id), error=str(exc))

    def _unmount(self, allocation_id: uuid.UUID, path: str) -> None:
        """Unmount whatever is stacked at ``path`` in the namespace (lazily)."""
        while self._mounted_inside(allocation_id, path):
            self._enter(allocation_id, "umount", "-l", path)

    def detach(self, allocation_id: uuid.UUID, volume_id: uuid.UUID) -> bool:
        """Unmount the volume (idempotent); True when it was mounted."""
        table = self.table(allocation_id)
        mounted = table.get(volume_id)
        if mounted is None:
            return False
        if mounted.via == "bind" and mounted_at(self.file_of(allocation_id)):
            self._unmount(allocation_id, mounted.mount_point)
            self._enter(allocation_id, "rmdir", "--ignore-fail-on-non-empty", mounted.mount_point)
        table.drop(volume_id)
        return True

    def remove(self, allocation_id: uuid.UUID) -> None:
        """Take every volume, the namespace and the record away (idempotent; nothing to do for an allocation
        that never had a volume: no command runs then)."""
        if self.file_of(allocation_id).exists():
            self._drop_namespace(allocation_id)
        self.table(allocation_id).remove()
