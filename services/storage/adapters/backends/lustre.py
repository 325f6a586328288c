"""Lustre (DDN EXAScaler): a directory per volume, limited by a project quota, reached through nodemaps.

Each volume is the directory ``<mount>/<subdir>/t-<tenant8>-v-<volume8>`` of the file system, with project id
``project_id(volume_id)`` set on it and inherited by everything created beneath (``lfs project -p ID -s``) and
a project block hard limit (``lfs setquota -p ID -B KiB``; KiB is lfs's default unit, the size is rounded up).
Clients reach it through two nodemaps, ``p<ID>_rw`` and ``p<ID>_ro`` (nodemap names: at most 16 characters,
letters, digits and ``_``), made with the volume:

* ``admin=0`` (root is squashed) and ``trusted=0`` (client identities are not trusted, so unmapped users and
  groups are squashed to nobody, 65534; the directory is owned by 65534:65534 so the tenant can write to it);
* ``squash_projid=ID``: any project id a client sends is squashed to the volume's, so nothing a tenant writes
  escapes its quota;
* the fileset ``/<subdir>/<name>``: the clients of the nodemap see that directory as the file system's root,
  whatever they mount; ``p<ID>_ro`` also has ``readonly_mount=1``.

``allow`` adds one NID range per client (``<address>@<net>``, ``net`` that of the MGS NID) to the nodemap of its
mode; ``revoke`` removes it. A node mounts ``<mgs_nid>:/<fsname>`` (the Export): the nodemap's fileset is then
its root. It must not name the subdirectory, which the MDS would append to the fileset (``mdt_get_root``,
lustre/mdt/mdt_handler.c: "consider fileset from client as a sub-fileset of the nodemap one"). A NID belongs to
one nodemap, so a client mounts one Lustre volume of this file system at a time: ``allow`` refuses a client
another volume already lets in. Nodemaps must be active on the MGS (``lctl nodemap_activate 1``, done once).

Project ids: ``project_id_base + volume_id.int % (2**31 - project_id_base)`` — stable, below 2**31. Two live
volumes can map to one id (the chance grows as n²/2**32); ``create`` refuses a volume whose id another live
volume of this driver holds.

Calls are command lines (method "exec"): ``lctl nodemap_*`` run on the MGS, the others on the management host
that mounts the file system at ``mount``; a real ``send`` routes them by program name.

Documentation:
* lfs project: https://github.com/lustre/lustre-release/blob/master/lustre/doc/lfs-project.1
* lfs setquota / lfs quota: https://github.com/lustre/lustre-release/blob/master/lustre/doc/lfs-setquota.1,
  https://github.com/lustre/lustre-release/blob/master/lustre/doc/lfs-quota.1
* project quotas: https://wiki.lustre.org/Lustre_Project_Quotas
* nodemaps: https://github.com/lustre/lustre-release/blob/master/lustre/doc/lctl-nodemap-add-range.8,
  https://github.com/lustre/lustre-release/blob/master/lustre/doc/lctl-nodemap-modify.8,
  https://github.com/lustre/lustre-release/blob/master/lustre/doc/lctl-nodemap-set-fileset.8,
  https://github.com/lustre/lustre-release/blob/master/lustre/doc/lctl-nodemap-add.8,
  https://github.com/lustre/lustre-release/blob/master/lustre/doc/lctl-nodemap-del.8,
  https://github.com/lustre/lustre-release/blob/master/lustre/doc/lctl-nodemap-del-range.8
"""
from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from .appliances import NO_ACCESS, NOBODY, Access, CallLog, RenderingBackend, changed, check_grow, clients_of, volume_name
from .base import BackendCall, BackendError, Export, VolumeSpec

PROJECT_ID_END = 2**31


@dataclass(frozen=True)
class LustreConfig:
    mount: str = "/lustre/fs0"          # where the management host mounts the file system
    mgs_nid: str = "10.0.0.2@o2ib"      # the MGS's NID, as clients name it
    fsname: str = "fs0"                 # the file system's name (at most 8 characters)
    project_id_base: int = 1_000_000    # the lowest project id a volume gets
    subdir: str = "tessera"             # the volumes' directory under the file system's root

    def __post_init__(self) -> None:
        if not self.mount.startswith("/") or self.mount.rstrip("/") != self.mount:
            raise ValueError(f"lustre mount {self.mount!r} must be an absolute path without a trailing /")
        if not re.fullmatch(r"[^@\s]+@[a-z0-9]+", self.mgs_nid):
            raise ValueError(f"lustre MGS NID {self.mgs_nid!r} is not of the form <address>@<net>")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,8}", self.fsname):
            raise ValueError(f"lustre fsname {self.fsname!r} is not 1-8 letters, digits, - or _")
        if not 1 <= self.project_id_base < PROJECT_ID_END - 1:
            raise ValueError(f"lustre project id base {self.project_id_base} is not in [1, 2**31 - 1)")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*", self.subdir):
            raise ValueError(f"lustre subdir {self.subdir!r} is not a relative path")

    @property
    def net(self) -> str:
        """The LNet network of the clients' NIDs: the MGS NID's."""
        return self.mgs_nid.split("@", 1)[1]


def exec_(*argv: str | int) -> BackendCall:
    return BackendCall("exec", shlex.join(str(a) for a in argv))


class LustreBackend(RenderingBackend):
    name = "lustre"

    def __init__(self, config: LustreConfig | None = None, log: CallLog | None = None):
        super().__init__(log)
        self.config = config or LustreConfig()

    # -- names ----------------------------------------------------------------------------------------------------
    def project_id(self, volume_id: uuid.UUID) -> int:
        base = self.config.project_id_base
        return base + volume_id.int % (PROJECT_ID_END - base)

    def fileset(self, spec: VolumeSpec) -> str:
        """The volume's directory from the file system's root."""
        return f"/{self.config.subdir}/{volume_name(spec)}"

    def directory(self, spec: VolumeSpec) -> str:
        """The volume's directory on the management host."""
        return self.config.mount + self.fileset(spec)

    def nodemap(self, spec: VolumeSpec, read_only: bool) -> str:
        return f"p{self.project_id(spec.volume_id)}_{'ro' if read_only else 'rw'}"

    def nid(self, client: str) -> str:
        return f"{client}@{self.config.net}"

    # -- renderers --------------------------------------------------------------------------------------------------
    def _setquota(self, spec: VolumeSpec, size_bytes: int) -> BackendCall:
        kib = -(-size_bytes // 1024)
        return exec_("lfs", "setquota", "-p", self.project_id(spec.volume_id), "-B", kib, self.config.mount)

    def create_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        pid, directory = self.project_id(spec.volume_id), self.directory(spec)
        calls = [exec_("mkdir", "-p", directory),
                 exec_("chown", f"{NOBODY}:{NOBODY}", directory),
                 exec_("lfs", "project", "-p", pid, "-s", directory),
                 self._setquota(spec, spec.size_bytes)]
        for read_only in (False, True):
            nodemap = self.nodemap(spec, read_only)
            properties = [("admin", 0), ("trusted", 0), ("squash_projid", pid)] + ([("readonly_mount", 1)]
                                                                                   if read_only else [])
            calls.append(exec_("lctl", "nodemap_add", nodemap))
            calls += [exec_("lctl", "nodemap_modify", "--name", nodemap, "--property", prop, "--value", value)
                      for prop, value in properties]
            calls.append(exec_("lctl", "nodemap_set_fileset", "--name", nodemap, "--fileset", self.fileset(spec)))
        return calls

    def resize_calls(self, spec: VolumeSpec, size_bytes: int) -> list[BackendCall]:
        return [self._setquota(spec, size_bytes)] if check_grow(spec, size_bytes) else []

    def delete_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        return [exec_("lctl", "nodemap_del", self.nodemap(spec, False)),
                exec_("lctl", "nodemap_del", self.nodemap(spec, True)),
                exec_("rm", "-rf", self.directory(spec)),
                exec_("lfs", "setquota", "-p", self.project_id(spec.volume_id), "-B", 0, self.config.mount)]

    def _range(self, op: str, spec: VolumeSpec, client: str, read_only: bool) -> BackendCall:
        return exec_("lctl", f"nodemap_{op}_range", "--name", self.nodemap(spec, read_only),
                     "--range", self.nid(client))

    def allow_calls(self, spec: VolumeSpec, clients: Iterable[str], read_only: bool,
                    access: Access = NO_ACCESS) -> list[BackendCall]:
        calls = []
        for client in changed(clients, read_only, access):
            if client in access:                     # there in the other mode: out of that nodemap first
                calls.append(self._range("del", spec, client, access[client]))
            calls.append(self._range("add", spec, client, read_only))
        return calls

    def revoke_calls(self, spec: VolumeSpec, clients: Iterable[str], access: Access = NO_ACCESS) -> list[BackendCall]:
        return [self._range("del", spec, c, access[c]) for c in clients_of(clients) if c in access]

    def usage_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        return [exec_("lfs", "quota", "-p", self.project_id(spec.volume_id), self.config.mount)]

    def export(self, spec: VolumeSpec) -> Export:
        return Export(spec.volume_id, self.name, f"{self.config.mgs_nid}:/{self.config.fsname}",
                      {"fstype": "lustre", "flock": ""})

    # -- clashes ------------------------------------------------------------------------------------------------
    def refuse_create(self, spec: VolumeSpec) -> None:
        super().refuse_create(spec)
        pid = self.project_id(spec.volume_id)
        for other in self.volumes.values():
            if self.project_id(other.spec.volume_id) == pid:
                raise BackendError(f"volume {spec.volume_id} maps to Lustre project id {pid}, which volume "
                                   f"{other.spec.volume_id} holds; create it under another id")

    def refuse_allow(self, spec: VolumeSpec, clients: tuple[str, ...]) -> None:
        for other in self.volumes.values():
            if other.spec.volume_id == spec.volume_id:
                continue
            if taken := [c for c in clients if c in other.access]:
                raise BackendError(f"client(s) {', '.join(taken)} already mount Lustre volume {other.spec.volume_id}; "
                                   "a Lustre client belongs to one nodemap, so it mounts one volume at a time")
