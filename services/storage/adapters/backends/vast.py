"""VAST Data through the VMS REST API: a view, a quota and a view policy per volume.

Each volume is the path ``<base_path>/t-<tenant8>-v-<volume8>`` of the VAST Element Store (VAST tenant
``tenant_id``), exposed over NFSv3 by a view of that name (``POST /api/views/``, ``create_dir``), limited by a
quota of that name (``POST /api/quotas/``, ``hard_limit`` in bytes; resize ``PATCH``es it) and guarded by a view
policy of its own, named by the ``policy_name`` rule (``{volume}`` is the volume's name). The policy lists its
hosts exactly: ``nfs_read_write`` and ``nfs_read_only`` hold the clients ``allow`` let in, in that mode, each a
single address; no other host can mount the view. Every allow and revoke ``PATCH``es the policy with its whole
new lists. The listed hosts are also ``nfs_no_squash``: the tenant's root owns its volume, as on a local disk
(the view confines it to the volume's path; with root squashed, the root-owned new directory would be
unwritable).

``delete`` removes the view, the quota, the directory with its data (``DELETE /api/folders/delete_folder/``:
deleting a view leaves its path; this needs the trash folder API, VAST 4.7+) and the policy. VAST numbers the
views, quotas and policies it creates, so later calls address them by name through references
(``appliances.ref``; the view's ``policy_id`` too). A node mounts ``<nfs_host>:<path>`` over NFSv3.

Documentation:
* views and view policies: https://kb.vastdata.com/documentation/docs/views-and-view-policies-6
* view policy host lists (``--nfs-read-write``, ``--nfs-read-only``, ``--nfs-no-squash`` HOSTS):
  https://kb.vastdata.com/documentation/docs/viewpolicy-create-2,
  https://kb.vastdata.com/documentation/docs/viewpolicy-modify
* quotas over REST (``/api/quotas/``, ``/api/quotas/<id>/``, ``hard_limit`` in bytes, ``used_capacity``):
  https://kb.vastdata.com/docs/managing-quotas-using-rest
* REST field names of views, view policies and quotas (VAST's Terraform provider):
  https://github.com/vast-data/terraform-provider-vastdata/blob/HEAD/docs/resources/view.md,
  https://github.com/vast-data/terraform-provider-vastdata/blob/HEAD/docs/resources/view_policy.md,
  https://github.com/vast-data/terraform-provider-vastdata/blob/HEAD/docs/resources/quota.md
* deleting a directory over REST (VAST's CSI driver, ``delete_folder``):
  https://github.com/vast-data/vast-csi/blob/HEAD/vast_csi/vms_session.py,
  https://kb.vastdata.com/documentation/docs/trash-folder-for-rapid-parallel-file-deletion
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address

from .appliances import NO_ACCESS, Access, CallLog, RenderingBackend, check_grow, clients_of, granted, ref, volume_name
from .base import BackendCall, Export, VolumeSpec

NFS_OPTIONS = {"fstype": "nfs", "vers": "3", "proto": "tcp", "hard": ""}


@dataclass(frozen=True)
class VastConfig:
    vms_url: str = "https://vms.example"     # the VAST Management System
    base_path: str = "/tessera"              # the volumes' directory in the Element Store
    policy_name: str = "vp-{volume}"         # the view policy naming rule ({volume}: the volume's name)
    nfs_host: str = "vip.vast.example"       # a VIP (or the DNS name of the VIP pool) nodes mount from
    tenant_id: int = 1                       # the VAST tenant (VMS id) owning the views, quotas and policies

    def __post_init__(self) -> None:
        if not re.fullmatch(r"https?://[^/\s]+", self.vms_url):
            raise ValueError(f"VMS URL {self.vms_url!r} must be scheme://host, without a path")
        if not re.fullmatch(r"(/[A-Za-z0-9_.-]+)+", self.base_path):
            raise ValueError(f"VAST base path {self.base_path!r} must be an absolute path without a trailing /")
        if "{volume}" not in self.policy_name:
            raise ValueError(f"VAST view policy naming rule {self.policy_name!r} must contain {{volume}}")


class VastBackend(RenderingBackend):
    name = "vast"

    def __init__(self, config: VastConfig | None = None, log: CallLog | None = None):
        super().__init__(log)
        self.config = config or VastConfig()

    def api(self, path: str) -> str:
        return f"{self.config.vms_url}/api/{path}"

    def path(self, spec: VolumeSpec) -> str:
        return f"{self.config.base_path}/{volume_name(spec)}"

    def policy(self, spec: VolumeSpec) -> str:
        return self.config.policy_name.format(volume=volume_name(spec))

    def _quota_url(self, spec: VolumeSpec) -> str:
        return self.api(f"quotas/{ref('name', volume_name(spec))}/")

    def _policy_url(self, spec: VolumeSpec) -> str:
        return self.api(f"viewpolicies/{ref('name', self.policy(spec))}/")

    def _hosts(self, access: Access) -> dict:
        """The policy's host lists for ``access``: exactly its clients, each once, in address order."""
        rw, ro = granted(access, False), granted(access, True)
        return {"nfs_read_write": rw, "nfs_read_only": ro, "nfs_no_squash": sorted(rw + ro, key=IPv4Address)}

    def create_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        name, path, tenant = volume_name(spec), self.path(spec), self.config.tenant_id
        return [
            BackendCall("POST", self.api("viewpolicies/"), {"name": self.policy(spec), "tenant_id": tenant,
                                                            "flavor": "NFS", "auth_source": "RPC",
                                                            **self._hosts({})}),
            BackendCall("POST", self.api("views/"), {"name": name, "path": path, "create_dir": True,
                                                     "protocols": ["NFS"], "tenant_id": tenant,
                                                     "policy_id": ref("name", self.policy(spec), "viewpolicies")}),
            BackendCall("POST", self.api("quotas/"), {"name": name, "path": path, "tenant_id": tenant,
                                                      "hard_limit": spec.size_bytes}),
        ]

    def resize_calls(self, spec: VolumeSpec, size_bytes: int) -> list[BackendCall]:
        if not check_grow(spec, size_bytes):
            return []
        return [BackendCall("PATCH", self._quota_url(spec), {"hard_limit": size_bytes})]

    def delete_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        return [
            BackendCall("DELETE", self.api(f"views/{ref('name', volume_name(spec))}/")),
            BackendCall("DELETE", self._quota_url(spec)),
            BackendCall("DELETE", self.api("folders/delete_folder/"), {"path": self.path(spec),
                                                                        "tenant_id": self.config.tenant_id}),
            BackendCall("DELETE", self._policy_url(spec)),
        ]

    def _patch(self, spec: VolumeSpec, before: Access, after: Access) -> list[BackendCall]:
        if dict(after) == dict(before):
            return []
        return [BackendCall("PATCH", self._policy_url(spec), self._hosts(after))]

    def allow_calls(self, spec: VolumeSpec, clients: Iterable[str], read_only: bool,
                    access: Access = NO_ACCESS) -> list[BackendCall]:
        return self._patch(spec, access, {**access, **dict.fromkeys(clients_of(clients), read_only)})

    def revoke_calls(self, spec: VolumeSpec, clients: Iterable[str], access: Access = NO_ACCESS) -> list[BackendCall]:
        gone = set(clients_of(clients))
        return self._patch(spec, access, {c: ro for c, ro in access.items() if c not in gone})

    def usage_calls(self, spec: VolumeSpec) -> list[BackendCall]:
        return [BackendCall("GET", self._quota_url(spec))]

    def export(self, spec: VolumeSpec) -> Export:
        return Export(spec.volume_id, self.name, f"{self.config.nfs_host}:{self.path(spec)}", dict(NFS_OPTIONS))
