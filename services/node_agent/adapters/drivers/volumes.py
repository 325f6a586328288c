"""What every driver shares to mount tenant volumes: the node's volume settings, the check that a btrfs
source lies under a volume root, and the per-allocation record of what is mounted.

Settings (read by the drivers' ``from_env``, in bootstrap; never at import time):
  TESSERA_VOLUME_ROOTS      [$TESSERA_BTRFS_ROOT, else /var/lib/tessera/volumes] colon-separated absolute
                            directories: the only places a btrfs volume's source may lie (below, not at, a root)
  TESSERA_VOLUME_STATE_DIR  [/run/tessera/volumes] the node's mount state: ``mntns/`` (a persistent mount
                            namespace per allocation of network-namespace slots) and ``views/`` (read-only
                            bind mounts of read-only volumes, shared with VMs)

Safety: a source is resolved with ``realpath`` (symlinks followed, ``..`` collapsed) and must then lie strictly
below a root that is itself resolved the same way; a source naming ``..`` at all is refused before resolving.
Whatever is refused raises ``DriverError`` with the reason: the step (or the live mount) fails for good, no retry
can change it.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from shared.files import replace_atomically

from ...domain.volumes import MountedVolume, Volume, within
from .base import DriverConfigError, DriverError

ROOTS_VAR = "TESSERA_VOLUME_ROOTS"
STATE_VAR = "TESSERA_VOLUME_STATE_DIR"
DEFAULT_ROOT = Path("/var/lib/tessera/volumes")
DEFAULT_STATE_DIR = Path("/run/tessera/volumes")


@dataclass(frozen=True)
class VolumeConfig:
    roots: tuple[Path, ...] = (DEFAULT_ROOT,)
    state_dir: Path = DEFAULT_STATE_DIR

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> VolumeConfig:
        """From TESSERA_VOLUME_ROOTS (else TESSERA_BTRFS_ROOT) and TESSERA_VOLUME_STATE_DIR; raises
        DriverConfigError for a relative path. Touches nothing."""
        raw = (environ.get(ROOTS_VAR) or "").strip() or (environ.get("TESSERA_BTRFS_ROOT") or "").strip()
        roots = tuple(Path(p) for p in raw.split(":") if p.strip()) if raw else (DEFAULT_ROOT,)
        state = Path((environ.get(STATE_VAR) or "").strip() or DEFAULT_STATE_DIR)
        for path, var in [(r, ROOTS_VAR) for r in roots] + [(state, STATE_VAR)]:
            if not path.is_absolute():
                raise DriverConfigError(f"{var}: {str(path)!r} is not an absolute path")
        return cls(roots, state)

    def source_of(self, volume: Volume) -> str:
        """The real path of a btrfs volume's source, once checked: a directory strictly below one of the volume
        roots after every symlink is resolved. Raises DriverError saying why it is refused. Blocking (stat)."""
        if ".." in PurePosixPath(volume.source).parts:
            raise DriverError(f"volume {volume.volume_id}: source {volume.source!r} names '..': refused")
        real = os.path.realpath(volume.source)
        roots = [os.path.realpath(r) for r in self.roots]
        if not within(real, roots):
            raise DriverError(f"volume {volume.volume_id}: source {volume.source!r} (really {real!r}) is not below "
                              f"a volume root of this node ({':'.join(roots)}): refused")
        if not os.path.isdir(real):
            raise DriverError(f"volume {volume.volume_id}: source {real!r} is not a directory on this node")
        return real


def mounted_at(path: Path | str) -> bool:
    """Whether something is mounted at ``path`` in this process's mount namespace (from /proc/self/mountinfo:
    ``os.path.ismount`` misses a bind mount of a directory of the same file system, as of a directory onto
    itself)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            where = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])   # \040 is a space
            if where == target:
                return True
    return False


def same_directory(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stats are of one directory (what was checked is what got mounted)."""
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class MountTable:
    """The allocation's mounts as a JSON file written atomically (it survives a restart of the agent, so a
    deprovision after a crash still knows what to take away). Blocking; small files."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def _read(self) -> dict[str, dict]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}

    def all(self) -> list[MountedVolume]:
        return [MountedVolume.from_record(r) for r in self._read().values()]

    def get(self, volume_id: uuid.UUID) -> MountedVolume | None:
        record = self._read().get(str(volume_id))
        return MountedVolume.from_record(record) if record else None

    def by_name(self, name: str) -> MountedVolume | None:
        return next((m for m in self.all() if m.name == name), None)

    def put(self, mount: MountedVolume) -> None:
        self._write({**self._read(), str(mount.volume_id): mount.record()})

    def drop(self, volume_id: uuid.UUID) -> None:
        table = self._read()
        if table.pop(str(volume_id), None) is not None:
            self._write(table)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def _write(self, table: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(self.path, lambda f: json.dump(table, f), durable=False)


def claim(table: MountTable, volume: Volume) -> MountedVolume | None:
    """The volume's mount when it is mounted already (a repeated command), else None; raises DriverError when
    another volume holds its mount point."""
    mounted = table.get(volume.volume_id)
    if mounted is not None:
        return mounted
    other = table.by_name(volume.name)
    if other is not None:
        raise DriverError(f"{volume.mount_point} is taken by volume {other.volume_id} in this allocation")
    return None
