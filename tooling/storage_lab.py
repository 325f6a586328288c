"""The storage host of the embedded platform: a real btrfs file system on a loop file in the data folder, and
the storage classes the platform offers.

``./taskw up``, the end-to-end tests and the benchmarks run the storage service with:
- ``standard`` (the default class): btrfs, one subvolume per volume with a qgroup limit, on
  ``<data folder>/volumes`` (``volumes.img``, a sparse file, made and mounted on first start and kept with the
  data folder; unmounted when the platform stops);
- ``lustre``, ``vast``, ``weka``: the parallel-file-system drivers, which render and record the exact calls a
  DDN EXAScaler, a VAST cluster or a WEKA cluster would receive: no appliance is reached from this machine
  (the classes say ``simulated``).

The storage service and every node-agent get ``TESSERA_BTRFS_ROOT``: the service makes subvolumes under it, a
node-agent mounts only sources under it into its slots.

Making the file system needs root (losetup, mount) and btrfs-progs (system-packages.txt). Without them the
platform still starts; creating a ``standard`` volume then fails with the backend's reason.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from services.storage.adapters.backends.base import BackendError
from services.storage.adapters.backends.btrfs import ensure_loop_filesystem, unmount_loop_filesystem

IMAGE_BYTES = 4 << 30            # sparse: blocks are used only as volumes are written
CLASSES = {
    "standard": {"backend": "btrfs", "default": True,
                 "description": "btrfs subvolume with a qgroup limit on the storage host (real)"},
    "lustre": {"backend": "lustre", "description": "DDN EXAScaler (Lustre) project quota (calls rendered, recorded)",
               "mgs_nid": "10.0.0.2@o2ib", "fsname": "fs0", "mount": "/lustre/fs0"},
    "vast": {"backend": "vast", "description": "VAST view, quota and view policy (calls rendered, recorded)",
             "vms_url": "https://vms.vast.example", "nfs_host": "vip.vast.example"},
    "weka": {"backend": "weka", "description": "WEKA filesystem and NFS client groups (calls rendered, recorded)",
             "url": "https://weka.example:14000", "nfs_host": "nfs.weka.example"},
}


class StorageLab:
    """The platform's btrfs root and its classes; ``env`` is what the storage service and node-agents get."""

    def __init__(self, workdir: Path):
        self.root = Path(workdir) / "volumes"
        self.image = Path(workdir) / "volumes.img"
        self.node_state = Path(workdir) / "node-volumes"   # the node-agents' mount namespaces and read-only views
        self.mounted = False

    def start(self) -> None:
        """Make (first start) and mount the file system; a machine that cannot is told why on stderr."""
        try:
            ensure_loop_filesystem(self.image, self.root, IMAGE_BYTES)
            self.mounted = True
        except (BackendError, OSError) as exc:
            print(f"storage: no btrfs volume root at {self.root} ({exc}); volumes of class 'standard' will fail",
                  file=sys.stderr)

    def stop(self) -> None:
        """Unmount (the data stays in the image for the next start); a busy file system (a mount a crashed
        node-agent left in a slot) is detached lazily, so the platform's stop never hangs on it."""
        for kept in (self.node_state / "mntns", self.node_state / "views"):   # their private bind mounts
            if kept.exists():
                subprocess.run(["umount", "-l", str(kept)], capture_output=True, timeout=30)
        if not self.mounted:
            return
        self.mounted = False
        try:
            unmount_loop_filesystem(self.root)
        except BackendError as exc:
            print(f"storage: {exc}; unmounting {self.root} lazily", file=sys.stderr)
            subprocess.run(["umount", "-l", str(self.root)], capture_output=True, timeout=30)

    def env(self, service: str) -> dict[str, str]:
        if service == "storage":
            return {"TESSERA_BTRFS_ROOT": str(self.root), "TESSERA_STORAGE_CLASSES": json.dumps(CLASSES)}
        if service == "node_agent":
            return {"TESSERA_BTRFS_ROOT": str(self.root), "TESSERA_VOLUME_STATE_DIR": str(self.node_state)}
        return {}


def wanted(extra_env: dict[str, str]) -> bool:
    """Whether the platform makes its own storage host: not when the caller configured the classes itself."""
    return "TESSERA_STORAGE_CLASSES" not in extra_env
