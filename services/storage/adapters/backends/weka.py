"""WEKA through its REST API v2: a filesystem per volume, exported over NFS to two client groups of its own.

Each volume is the WEKA filesystem ``t-<tenant8>-v-<volume8>`` in the filesystem group ``fs_group``, its
``total_capacity`` the volume's limit (the filesystem level of WEKA's capacity restrictions; a directory quota
would need the filesystem mounted on the host that sets it, so a filesystem per volume is what a REST-only
driver can limit). Resize ``PUT``s the new capacity.

Access is NFS (WEKA's NFS service; a native wekafs mount is not restricted by client address). The volume has
two NFS client groups, named by the ``client_group`` rule (``{volume}``: the volume's name, ``{mode}``: ``rw``
or ``ro``), each with an NFS permission on the filesystem's root: ``RW`` for the one, ``RO`` for the other,
squash ``none`` (the tenant's root owns its volume, as on a local disk; the permission confines it to this
filesystem). ``allow`` adds one IP rule per client (``<address>/255.255.255.255``: exactly that host) to the
group of its mode (out of the other group first if it was there); ``revoke`` deletes the rule. ``delete`` takes
the permissions, the groups and the filesystem away. WEKA numbers what it creates (uids), so later calls
address the filesystem, groups, rules and permissions through references (``appliances.ref``). A node mounts
``<nfs_host>:/<filesystem>`` over NFSv3 (``proto=tcp`` is mandatory with WEKA, ``hard`` and ``vers`` advised).

Documentation:
* REST API (v2 under ``https://<cluster>:14000/api/v2``) and its CLI equivalents:
  https://docs.weka.io/getting-started-with-weka/weka-rest-api-and-equivalent-cli-commands
* NFS: interface groups, client groups (IP rules with netmask), permissions (RW/RO, squash):
  https://docs.weka.io/additional-protocols/nfs-support
* NFS client mount parameters (v4.3, "Supported NFS client mount parameters"):
  https://docs.weka.io/4.3/~gitbook/pdf?only=yes&page=-LGNlcsUYOqy8L92b8Xh
* quotas at filesystem and directory level: https://docs.weka.io/fs/quota-management
* exact v2 paths and bodies (WEKA's CSI driver: ``fileSystems``, ``nfs/clientGroups/<uid>/rules``,
  ``nfs/permissions``): https://github.com/weka/csi-wekafs/blob/HEAD/pkg/wekafs/apiclient/filesystem.go,
  https://github.com/weka/csi-wekafs/blob/HEAD/pkg/wekafs/apiclient/nfs.go
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .appliances import NO_ACCESS, NOBODY, Access, CallLog, RenderingBackend, changed, check_grow, clients_of, ref, volume_name
from .base import BackendCall, Export, VolumeSpec

NFS_OPTIONS = {"fstype": "nfs", "vers": "3", "proto": "tcp", "hard": ""}


@dataclass(frozen=True)
class WekaConfig:
    url: str = "https://weka.example:14000"     # the cluster's management endpoint
    fs_group: str = "default"                   # the filesystem group the volumes' filesystems join
    client_group: str = "{volume}-{mode}"       # the NFS client group naming rule ({volume}, {mode}: rw | ro)
    nfs_host: str = "nfs.weka.example"          # a floating IP (or round-robin DNS name) of the NFS service

    def __post_init__(self) -> None:
        if not re.fullmatch(r"https?://[^/\s]+", self.url):
            raise ValueError(f"WEKA URL {self.url!r} must be scheme://host[:port], without a path")
        if "{volume}" not in self.client_group or "{mode}" not in self.client_group:
            raise ValueError(f"WEKA client group naming rule {self.client_group!r} must contain {{volume}} and {{mode}}")


def rule(client: str) -> str:
    """The client group rule letting exactly ``client`` in."""
    return f"{client}/255.255.255.255"


class WekaBackend(RenderingBackend):
    name = "weka"

    def __init__(self, config: WekaConfig | None = None, log: CallLog | None = None):
        super().__init__(log)
        self.config = config or WekaConfig()

    def api(self, path: str) -> str:
        return f"{self.config.url}/api/v2/{path}"

    def group(self, spec: VolumeSpec, read_only: bool) -> str:
        return self.config.client_group.format(volume=volume_name(spec), mode="ro" if read_only else "rw")

    def _fs_url(self, spec: VolumeSpec) -> str:
        return self.api(f"fileSystems/{ref('name', volume_name(spec))}")

    def _rules_url(self, spec: VolumeSpec, read_only: bool) -> str:
        return self.api(f"nfs/clientGroups/{ref('name', self.group(spec, read_only))}/rules")

    def create_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        fs = volume_name(spec)
        calls = [BackendCall("POST", self.api("fileSystems"), {"name": fs, "group_name": self.config.fs_group,
                                                               "total_capacity": spec.size_bytes})]
        calls += [BackendCall("POST", self.api("nfs/clientGroups"), {"name": self.group(spec, ro)})
                  for ro in (False, True)]
        calls += [BackendCall("POST", self.api("nfs/permissions"),
                              {"filesystem": fs, "group": self.group(spec, ro), "path": "/",
                               "permission_type": "RO" if ro else "RW", "squash_mode": "none",
                               "anon_uid": NOBODY, "anon_gid": NOBODY, "supported_versions": ["V3", "V4"]})
                  for ro in (False, True)]
        return calls

    def resize_calls(self, spec: VolumeSpec, size_bytes: int) -> list[BackendCall]:
        if not check_grow(spec, size_bytes):
            return []
        return [BackendCall("PUT", self._fs_url(spec), {"total_capacity": size_bytes})]

    def delete_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        groups = [self.group(spec, ro) for ro in (False, True)]
        return ([BackendCall("DELETE", self.api(f"nfs/permissions/{ref('group', g)}")) for g in groups]
                + [BackendCall("DELETE", self.api(f"nfs/clientGroups/{ref('name', g)}")) for g in groups]
                + [BackendCall("DELETE", self._fs_url(spec))])

    def _delete_rule(self, spec: VolumeSpec, client: str, read_only: bool) -> BackendCall:
        return BackendCall("DELETE", f"{self._rules_url(spec, read_only)}/{ref('rule', rule(client))}")

    def allow_calls(self, spec: VolumeSpec, clients: Iterable[str], read_only: bool,
                    access: Access = NO_ACCESS) -> list[BackendCall]:
        calls = []
        for client in changed(clients, read_only, access):
            if client in access:                     # there in the other mode: out of that group first
                calls.append(self._delete_rule(spec, client, access[client]))
            calls.append(BackendCall("POST", self._rules_url(spec, read_only), {"ip": rule(client)}))
        return calls

    def revoke_calls(self, spec: VolumeSpec, clients: Iterable[str], access: Access = NO_ACCESS) -> list[BackendCall]:
        return [self._delete_rule(spec, c, access[c]) for c in clients_of(clients) if c in access]

    def usage_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        return [BackendCall("GET", self._fs_url(spec))]

    def export(self, spec: VolumeSpec) -> Export:
        return Export(spec.volume_id, self.name, f"{self.config.nfs_host}:/{volume_name(spec)}", dict(NFS_OPTIONS))
