"""``./taskw up``'s demo nodes as a real lab: each node in its own network namespace on one underlay bridge (as the
tests' lab), with the kernel dataplane and the libvirt driver (QEMU; TCG, as KVM cannot be counted on), so a
new user's first allocation boots a real guest from the project's image on a real isolated network.

It needs root, a working libvirtd (started here when needed) and the guest image (built once, cached); when any
of it is missing, ``prepare`` says why in one line and the demo nodes fall back to the sim driver. The lab's
name is kept in the data folder, so a restart of ``up`` on the same folder rebuilds the same namespaces for the
same nodes. At stop the lab goes: its guests are powered off and undefined and its namespaces removed; on the
next start each node-agent's reconcile makes its allocations' guests again from their images (reported as
``instance_restarted``), as it would after a host reboot.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from services.node_agent.adapters.dataplane.lab import UNDERLAY_DEV, Lab
from services.node_agent.domain.vm.domain_xml import parse_metadata

from .bmc_lab import make_loop_disk, remove_loop_disk
from .guest_image.build import GuestImage, ImageBuildError, ensure_image
from .libvirt_host import LibvirtUnavailable, ensure_libvirtd, libvirt_usable

URI = "qemu:///system"
NODES = 2
SLOTS = 8                                   # the demo nodes' sim topology: an 8-GPU HGX
WIPE_POLICY = "nvme-secure-erase+discard"   # NVMe format on an NVMe controller; the loop devices get blkdiscard


class DemoLab:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.record = workdir / "lab.json"
        saved = json.loads(self.record.read_text()) if self.record.exists() else {}
        self.lab = Lab(NODES, dataplanes=False, suffix=saved.get("suffix"))
        self.lab.node_ids = [uuid.UUID(n) for n in saved.get("node_ids", [])]
        self.image: GuestImage | None = None
        self.disks: list[list[str]] = []   # per node, its slots' NVMe stand-ins (loop devices), wiped on release

    def prepare(self) -> str | None:
        """Make the lab ready (namespaces, libvirtd, image); None when ready, else the reason it cannot run."""
        if os.geteuid() != 0:
            return "not root (namespaces, nftables and a system libvirtd need it)"
        missing = [c for c in ("ip", "nft") if shutil.which(c) is None]
        usable, why = libvirt_usable()
        if missing or not usable:
            return f"missing {', '.join(missing)}" if missing else why
        try:
            ensure_libvirtd(URI)
            self.image = ensure_image(log=lambda line: print(f"guest image: {line}", flush=True))
            if not self.lab.exists():
                self.lab.build()
            self._make_disks()
        except (LibvirtUnavailable, ImageBuildError, OSError, RuntimeError) as exc:
            return str(exc).splitlines()[0][:300]
        self._save()
        return None

    def _make_disks(self) -> None:
        """Eight small loop devices per node (sparse files in the data folder), made fresh at each start."""
        for i in range(NODES):
            folder = self.workdir / f"disks-{i}"
            folder.mkdir(exist_ok=True)
            self.disks.append([])
            for slot in range(SLOTS):
                self.disks[i].append(make_loop_disk(folder / f"nvme{slot}.img", 16))

    def _save(self) -> None:
        self.record.write_text(json.dumps({"suffix": self.lab.suffix, "node_ids": [str(n) for n in self.lab.node_ids]}))

    def node_env(self, index: int, disks: bool = True) -> dict[str, str]:
        """The node-agent's settings; ``disks``: its slots' loop devices are wiped on release (a node approved with
        WIPE_POLICY; without, passthrough off means the wipe is simulated and says so)."""
        return {"TESSERA_NODE_DRIVER": "libvirt", "TESSERA_LIBVIRT_URI": URI, "TESSERA_LIBVIRT_DOMAIN_TYPE": "qemu",
                "TESSERA_LIBVIRT_PASSTHROUGH": "off", "TESSERA_LIBVIRT_STATE_DIR": str(self.workdir / "instances"),
                # both nodes share one libvirtd: each names its domains apart, so a moved allocation never meets
                # its old domain's name (TESSERA_LIBVIRT_NAME_SUFFIX)
                "TESSERA_LIBVIRT_NAME_SUFFIX": f"n{index}",
                "TESSERA_NODE_DATAPLANE": "kernel", "TESSERA_NODE_NETNS": self.lab.node_ns[index],
                "TESSERA_NODE_UNDERLAY_DEV": UNDERLAY_DEV,
                "TESSERA_WIPE_DEVICES": json.dumps({str(s): [d] for s, d in enumerate(self.disks[index])}) if disks else ""}

    def add_node(self, node_id: str) -> None:
        self.lab.node_ids.append(uuid.UUID(node_id))
        self._save()

    def catalog_entry(self) -> dict:
        """POST /v1/images for the guest image: public and the default, so an allocation that names none boots it."""
        i = self.image
        return {"name": f"tessera-guest-{i.sha256[:8]}", "os": i.os, "format": i.format, "source": str(i.disk),
                "sha256": i.sha256, "min_disk_gb": i.min_disk_gb, "kernel": str(i.kernel), "initrd": str(i.initrd),
                "kernel_args": i.kernel_args, "visibility": "public", "default": True}

    def stop(self) -> None:
        """Power off and undefine the lab nodes' guests, then remove its namespaces (never raises)."""
        remove_domains_of({str(n) for n in self.lab.node_ids})
        self.lab.destroy()
        for devices in self.disks:
            for device in devices:
                remove_loop_disk(device)
        self.disks.clear()


def remove_domains_of(node_ids: set[str]) -> None:
    """Power off and undefine every domain whose Tessera metadata names one of ``node_ids`` (blocking, never
    raises): what a lab's nodes leave when their agents are gone."""
    try:
        names = subprocess.run(["virsh", "-c", URI, "list", "--all", "--name"], capture_output=True, text=True,
                               timeout=30).stdout.split()
        for name in names:
            xml = subprocess.run(["virsh", "-c", URI, "dumpxml", name], capture_output=True, text=True, timeout=30).stdout
            meta = parse_metadata(xml) if xml else None
            if meta and meta.get("node_id") in node_ids:
                subprocess.run(["virsh", "-c", URI, "destroy", name], capture_output=True, timeout=60)
                subprocess.run(["virsh", "-c", URI, "undefine", name], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
