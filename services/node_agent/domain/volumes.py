"""Tenant volumes as a node mounts them into an allocation's slots. Pure: no I/O.

A volume appears in every slot of its allocation at ``/mnt/<name>``, and nowhere else. How depends on where
the slots run and on the volume's backend:

- ``btrfs`` (real): the export's source is a subvolume's path on this host. A VM gets it as a virtiofs device
  (``virtiofs_tag``) its guest mounts at boot; a network-namespace slot gets a bind mount in the allocation's
  own mount namespace. The node-agent mounts only sources under its configured volume roots (checked on the
  host, after symlinks are resolved: ``within``).
- ``lustre``, ``vast``, ``weka``: an appliance this node cannot reach. The client mount command a slot would
  run is rendered (``client_mount_argv``), never run, and the mount is reported ``simulated``.

Everything a driver is given is checked here first (``Volume``; ValueError naming the field), so a name or a
source that could escape ``/mnt`` or break a command line never reaches the kernel.
"""
from __future__ import annotations

import os
import re
import shlex
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MOUNT_ROOT = "/mnt"
TAG_PREFIX = "tv-"
BACKENDS = ("btrfs", "lustre", "vast", "weka")
SIMULATED_BACKENDS = ("lustre", "vast", "weka")   # appliances: the client mount is rendered, not run
MODES = ("rw", "ro")
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")     # storage's VOLUME_NAME_PATTERN: one path component
_OPTION_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_OPTION_VALUE = re.compile(r"[A-Za-z0-9_.:/@+-]{0,256}")   # no ',' '=' or blanks: one item of a -o list
_CLIENT_FSTYPE = {"lustre": "lustre", "vast": "nfs", "weka": "nfs"}
_DEFAULT_OPTIONS = {"lustre": (), "vast": (("vers", "3"),), "weka": (("vers", "3"),)}


class InvalidVolume(ValueError):
    """A volume no node can mount as given (a bad name, mode, backend, source or option)."""


def virtiofs_tag(volume_id: uuid.UUID) -> str:
    """The virtiofs mount tag of a volume: ``tv-`` and the first 12 hex digits of its id (15 bytes; virtiofs
    allows 36). Unique among an allocation's volumes (``check_distinct`` refuses a clash)."""
    return TAG_PREFIX + uuid.UUID(str(volume_id)).hex[:12]


@dataclass(frozen=True)
class Volume:
    """One export to mount (storage's VolumeExport, checked). ``options``: backend mount options as pairs
    (value "" for a flag); ``fstype`` among them names the client's file system type."""

    volume_id: uuid.UUID
    name: str
    mode: str
    backend: str
    source: str
    options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise InvalidVolume(f"volume {self.volume_id}: name {self.name!r} is not [a-z0-9][a-z0-9-]{{0,62}}")
        if self.mode not in MODES:
            raise InvalidVolume(f"volume {self.volume_id}: mode {self.mode!r} is not rw or ro")
        if self.backend not in BACKENDS:
            raise InvalidVolume(f"volume {self.volume_id}: backend {self.backend!r} is not one of {list(BACKENDS)}")
        if not isinstance(self.source, str) or not self.source or not self.source.isprintable() \
                or any(ch.isspace() for ch in self.source):
            raise InvalidVolume(f"volume {self.volume_id}: source {self.source!r} is empty or not one printable word")
        if self.backend == "btrfs" and not os.path.isabs(self.source):
            raise InvalidVolume(f"volume {self.volume_id}: a btrfs source is an absolute path, not {self.source!r}")
        for key, value in self.options:
            if not _OPTION_KEY.fullmatch(key) or not _OPTION_VALUE.fullmatch(value):
                raise InvalidVolume(f"volume {self.volume_id}: mount option {key!r}={value!r} is malformed")

    @classmethod
    def of(cls, volume_id: uuid.UUID, name: str, mode: str, backend: str, source: str,
           options: Mapping[str, str] | None = None) -> Volume:
        return cls(volume_id, name, mode, backend, source, tuple((options or {}).items()))

    @property
    def mount_point(self) -> str:
        return f"{MOUNT_ROOT}/{self.name}"

    @property
    def read_only(self) -> bool:
        return self.mode == "ro"

    @property
    def tag(self) -> str:
        return virtiofs_tag(self.volume_id)

    @property
    def simulated(self) -> bool:
        return self.backend in SIMULATED_BACKENDS


@dataclass(frozen=True)
class MountedVolume:
    """A volume mounted into an instance, as the node reports it (contracts.Mount's fields), with what only the
    node's record keeps: the rendered client command of a simulated mount, the host directory a VM shares."""

    volume_id: uuid.UUID
    name: str
    mount_point: str
    mode: str
    via: str                        # virtiofs, bind, nfs or lustre
    tag: str | None = None
    simulated: bool = False
    command: str | None = None
    source: str | None = None

    def info(self) -> dict:
        """The contract's Mount, as JSON."""
        return {"volume_id": str(self.volume_id), "name": self.name, "mount_point": self.mount_point,
                "mode": self.mode, "via": self.via, "tag": self.tag, "simulated": self.simulated}

    def record(self) -> dict:
        return {**self.info(), "command": self.command, "source": self.source}

    @classmethod
    def from_record(cls, record: Mapping) -> MountedVolume:
        return cls(uuid.UUID(record["volume_id"]), record["name"], record["mount_point"], record["mode"],
                   record["via"], record.get("tag"), bool(record.get("simulated")), record.get("command"),
                   record.get("source"))


def check_distinct(volumes: Iterable[Volume]) -> tuple[Volume, ...]:
    """The volumes, refusing two with one id, one name (one mount point) or one virtiofs tag."""
    volumes = tuple(volumes)
    for what, key in (("id", lambda v: v.volume_id), ("name", lambda v: v.name), ("virtiofs tag", lambda v: v.tag)):
        seen: set = set()
        for v in volumes:
            if key(v) in seen:
                raise InvalidVolume(f"two volumes of the allocation have one {what}: {key(v)}")
            seen.add(key(v))
    return volumes


def client_mount_argv(volume: Volume) -> list[str]:
    """The command a slot would run to mount an appliance's volume: ``mount -t lustre <mgs>:/<fs> /mnt/<name>``
    or ``mount -t nfs -o vers=3,... <host>:/<path> /mnt/<name>``, ``ro`` added for a read-only volume."""
    if not volume.simulated:
        raise InvalidVolume(f"volume {volume.volume_id}: {volume.backend} is mounted by the node, not a client")
    given = dict(volume.options)
    fstype = given.pop("fstype", None) or _CLIENT_FSTYPE[volume.backend]
    options = [(k, v) for k, v in (given.items() or _DEFAULT_OPTIONS[volume.backend])]
    if volume.read_only and ("ro", "") not in options:
        options.append(("ro", ""))
    rendered = ",".join(f"{k}={v}" if v else k for k, v in options)
    return ["mount", "-t", fstype, *(["-o", rendered] if rendered else []), volume.source, volume.mount_point]


def simulated_mount(volume: Volume) -> MountedVolume:
    """The report of an appliance volume: its client command rendered, nothing run (``simulated``)."""
    argv = client_mount_argv(volume)
    return MountedVolume(volume.volume_id, volume.name, volume.mount_point, volume.mode,
                         "lustre" if argv[2] == "lustre" else "nfs", simulated=True, command=shlex.join(argv))


def within(resolved: str, roots: Iterable[str]) -> bool:
    """Whether the resolved absolute path ``resolved`` is strictly below one of the resolved ``roots`` (a root
    itself is not a volume). Both sides must already be real paths: this compares components only."""
    for root in roots:
        if resolved != root and os.path.commonpath([resolved, root]) == root:
            return True
    return False
