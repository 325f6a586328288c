"""Volumes of VM slices: each btrfs volume is a virtiofs device of the domain, the guest told by its NoCloud
seed to mount it at /mnt/<name> before it says it is ready; an appliance's volume is rendered only.

Read-only is enforced on the host: libvirt 9.0 refuses ``<readonly/>`` on virtiofs and QEMU 7.2's virtiofsd has
no read-only option, so a read-only volume is shared through a read-only bind mount the node makes, a *view*
(``<state>/views/<allocation id>/<volume id>``; ``Views``), and a guest that remounts it read-write still gets
EROFS. A view is checked (device, inode) against the source the node checked, and lives until the deprovision;
a domain started again after the host rebooted gets its views back first (``restore_volumes``).

A volume mounted live (``mount``) is attached with attachDeviceFlags (LIVE and CONFIG, so it stays across a
restart of the domain); the guest is not told: its tenant mounts it by the tag the reply's Mount carries
(``mount -t virtiofs <tag> /mnt/<name>``). It needs the domain's memory shared, which every domain has unless
TESSERA_LIBVIRT_VOLUME_HOTPLUG is off. A detach (``unmount``) waits until the guest released the device (ACPI
PCI hotplug: the project's guest does it in a fraction of a second, also with the tag still mounted, which then
fails with ENOTCONN, "Transport endpoint is not connected"); a guest that does not answer the unplug within
``detach_timeout_s`` fails the detach with the reason, and the volume stays recorded. The record of what is
mounted is ``mounts.json`` in the instance's directory.
"""
from __future__ import annotations

import os
import subprocess
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

from ....domain.model import InstanceSpec
from ....domain.vm.cloudinit import GuestMount
from ....domain.vm.filesystems import Filesystem, filesystem_xml
from ....domain.volumes import MountedVolume, Volume, simulated_mount
from ..base import DriverError
from ..volumes import MountTable, VolumeConfig, claim, mounted_at, same_directory


def _run(*argv: str | Path) -> None:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise DriverError(f"`{' '.join(map(str, argv))}` failed: {done.stderr.strip() or 'no error output'}")


def _has_tag(domain_xml: str, tag: str) -> bool:
    """Whether the domain XML has the virtiofs device of ``tag``."""
    return any(t.get("dir") == tag for t in ET.fromstring(domain_xml).iterfind("devices/filesystem/target"))


class Views:
    """The read-only bind mounts shared with VMs, under ``<state>/views``. Blocking."""

    def __init__(self, config: VolumeConfig):
        self.config = config
        self.directory = config.state_dir / "views"

    def share(self, allocation_id: uuid.UUID, volume: Volume, source: str | None = None) -> tuple[str, str]:
        """(the directory virtiofsd shares, the checked source): the source itself for a read-write volume,
        its read-only view for a read-only one. Idempotent. Raises DriverError."""
        source = source or self.config.source_of(volume)
        if not volume.read_only:
            return source, source
        view = self.directory / str(allocation_id) / str(volume.volume_id)
        view.mkdir(parents=True, exist_ok=True)
        if not mounted_at(view):
            _run("mount", "--bind", source, view)
            _run("mount", "-o", "remount,bind,ro", view)
        if not same_directory(os.stat(source), os.stat(view)):
            self.release(allocation_id, volume.volume_id)
            raise DriverError(f"volume {volume.volume_id}: the read-only view of {source} shows another directory")
        return str(view), source

    def release(self, allocation_id: uuid.UUID, volume_id: uuid.UUID | None = None) -> None:
        """Unmount and remove the allocation's views (one, or all). Idempotent."""
        base = self.directory / str(allocation_id)
        for view in ([base / str(volume_id)] if volume_id else sorted(base.glob("*")) if base.is_dir() else []):
            while mounted_at(view):
                _run("umount", "-l", view)
            if view.is_dir():
                view.rmdir()   # never a recursive removal: a view still mounted must not lose the volume's files
        if volume_id is None and base.is_dir():
            base.rmdir()


class LibvirtVolumes:
    """The libvirt driver's volume operations (a part of LibvirtDriver: it uses its lookups, locks and threads)."""

    views: Views

    def mount_table(self, allocation_id: uuid.UUID) -> MountTable:
        return MountTable(self.dir_of(allocation_id) / "mounts.json")

    def prepare_volumes(self, spec: InstanceSpec) -> tuple[tuple[Filesystem, ...], tuple[GuestMount, ...]]:
        """Share the spec's volumes (blocking): the domain's devices and the seed's mounts, recorded."""
        table, devices, guest = self.mount_table(spec.allocation_id), [], []
        for volume in spec.volumes:
            if volume.simulated:
                table.put(simulated_mount(volume))
                continue
            shared, source = self.views.share(spec.allocation_id, volume)
            devices.append(Filesystem(shared, volume.tag))
            guest.append(GuestMount(volume.tag, volume.mount_point, volume.read_only))
            table.put(self._mounted(volume, source))
        return tuple(devices), tuple(guest)

    @staticmethod
    def _mounted(volume: Volume, source: str) -> MountedVolume:
        return MountedVolume(volume.volume_id, volume.name, volume.mount_point, volume.mode, "virtiofs",
                             tag=volume.tag, source=source)

    def restore_volumes(self, allocation_id: uuid.UUID) -> None:
        """Before the domain starts again: the read-only views its devices share (gone with a host reboot)."""
        for m in self.mount_table(allocation_id).all():
            if m.via == "virtiofs" and m.mode == "ro" and m.source:
                volume = Volume(m.volume_id, m.name, m.mode, "btrfs", m.source)
                self.views.share(allocation_id, volume, self.views.config.source_of(volume))

    def volume_info(self, allocation_id: uuid.UUID) -> list[dict]:
        return [m.info() for m in self.mount_table(allocation_id).all()]

    async def mount(self, allocation_id: uuid.UUID, volume: Volume) -> MountedVolume:
        async with self._lock(allocation_id):
            return await self._call(self._attach, allocation_id, volume)

    async def unmount(self, allocation_id: uuid.UUID, volume_id: uuid.UUID) -> bool:
        async with self._lock(allocation_id):
            return await self._call(self._detach, allocation_id, volume_id)

    def _flags(self, dom) -> int:
        libvirt = self._libvirt()
        live = libvirt.VIR_DOMAIN_AFFECT_LIVE if dom.isActive() else 0
        return live | libvirt.VIR_DOMAIN_AFFECT_CONFIG

    def _attach(self, allocation_id: uuid.UUID, volume: Volume) -> MountedVolume:
        dom = self._lookup(allocation_id)
        if dom is None:
            raise DriverError(f"no instance of allocation {allocation_id} on this node")
        table = self.mount_table(allocation_id)
        mounted = claim(table, volume)
        if mounted is None and volume.simulated:
            mounted = simulated_mount(volume)
        elif mounted is None:
            shared, source = self.views.share(allocation_id, volume)
            try:
                self._errors("attach the virtiofs device", dom.attachDeviceFlags,
                             filesystem_xml(Filesystem(shared, volume.tag)), self._flags(dom))
            except DriverError:
                self.views.release(allocation_id, volume.volume_id)
                raise
            mounted = self._mounted(volume, source)
        table.put(mounted)
        return mounted

    def _detach(self, allocation_id: uuid.UUID, volume_id: uuid.UUID) -> bool:
        table = self.mount_table(allocation_id)
        mounted = table.get(volume_id)
        if mounted is None:
            return False
        dom, libvirt = self._lookup(allocation_id), self._libvirt()
        if dom is not None and mounted.via == "virtiofs":
            device = filesystem_xml(Filesystem(mounted.source or "/", mounted.tag))
            if _has_tag(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE), mounted.tag):
                self._errors("detach the virtiofs device", dom.detachDeviceFlags, device,
                             libvirt.VIR_DOMAIN_AFFECT_CONFIG)
            if dom.isActive() and _has_tag(dom.XMLDesc(0), mounted.tag):
                self._errors("detach the virtiofs device", dom.detachDeviceFlags, device,
                             libvirt.VIR_DOMAIN_AFFECT_LIVE)
                self._await_release(dom, mounted.tag)
        self.views.release(allocation_id, volume_id)
        table.drop(volume_id)
        return True

    def _await_release(self, dom, tag: str) -> None:
        """Until the running domain no longer has the device (the guest acknowledged the unplug)."""
        deadline = time.monotonic() + self.config.detach_timeout_s
        while _has_tag(dom.XMLDesc(0), tag):
            if time.monotonic() > deadline:
                raise DriverError(f"the guest did not release virtiofs device {tag} within "
                                  f"{self.config.detach_timeout_s:g} s (is it still mounted inside?): it stays")
            time.sleep(0.1)

    def release_volumes(self, allocation_id: uuid.UUID) -> None:
        """After the domain is gone: its read-only views (the record goes with the instance's directory)."""
        self.views.release(allocation_id)
