"""The virtiofs devices of a VM slice's volumes, and the shared memory they need. Pure: no I/O.

Each btrfs volume of an allocation is one ``<filesystem type='mount' accessmode='passthrough'>`` with a
virtiofs driver: libvirt starts one ``virtiofsd`` per device (it finds ``/usr/lib/qemu/virtiofsd`` itself)
sharing ``source_dir``, and the guest mounts it by its tag (``mount -t virtiofs TAG /mnt/NAME``).

virtio-fs needs the guest's memory shared with virtiofsd: ``<memoryBacking>`` gets ``<access mode='shared'/>``,
from a memfd (``<source type='memfd'/>``), or from the 1 GiB huge pages when the domain has them. A domain with
shared memory can also take a virtiofs device live (``filesystem_xml`` for attachDeviceFlags).

Read-only is not a device attribute here: libvirt 9.0 refuses ``<readonly/>`` on virtiofs ("virtiofs does not
yet support read-only mode") and QEMU 7.2's virtiofsd has no read-only option, so the node shares a read-only
bind mount of the volume instead (``adapters.drivers.libvirt.volumes``): the guest's writes fail with EROFS on
the host, whatever the guest does.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass

_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,35}")       # virtiofs: a tag of at most 36 bytes
_PATH_TEXT = re.compile(r"/[\x21-\x7e]*")                      # absolute, printable, no blanks


@dataclass(frozen=True)
class Filesystem:
    """One virtiofs device: the host directory shared and the tag the guest mounts it by."""

    source_dir: str
    tag: str

    def __post_init__(self) -> None:
        if not isinstance(self.source_dir, str) or not _PATH_TEXT.fullmatch(self.source_dir):
            raise ValueError(f"filesystem source: expected an absolute path without blanks, got {self.source_dir!r}")
        if not isinstance(self.tag, str) or not _TAG.fullmatch(self.tag):
            raise ValueError(f"filesystem tag: expected 1-36 of A-Z a-z 0-9 _ . -, got {self.tag!r}")


def filesystem_element(fs: Filesystem) -> ET.Element:
    el = ET.Element("filesystem", type="mount", accessmode="passthrough")
    ET.SubElement(el, "driver", type="virtiofs")
    ET.SubElement(el, "source", dir=fs.source_dir)
    ET.SubElement(el, "target", dir=fs.tag)
    return el


def filesystem_xml(fs: Filesystem) -> str:
    """The device XML alone (attachDeviceFlags, detachDeviceFlags: libvirt finds the device by its tag)."""
    return ET.tostring(filesystem_element(fs), encoding="unicode")


def add_filesystems(root: ET.Element, filesystems: Sequence[Filesystem], shared_memory: bool = False) -> None:
    """Add the devices to the domain ``root`` and share its memory when it has any device or ``shared_memory``
    (so a volume can be attached live later). Huge pages already asked for stay: they are shared instead of
    a memfd. Raises ValueError for two devices with one tag."""
    tags = [fs.tag for fs in filesystems]
    if len(set(tags)) != len(tags):
        raise ValueError(f"filesystem tags repeat: {tags}")
    if filesystems or shared_memory:
        backing = root.find("memoryBacking")
        if backing is None:
            backing = ET.Element("memoryBacking")
            after = max(i for i, el in enumerate(root) if el.tag in ("memory", "vcpu", "cputune", "numatune"))
            root.insert(after + 1, backing)
        if backing.find("hugepages") is None:
            ET.SubElement(backing, "source", type="memfd")
        ET.SubElement(backing, "access", mode="shared")
    devices = root.find("devices")
    if filesystems and devices is None:
        raise ValueError("the domain has no <devices>")
    at = next((i for i, el in enumerate(devices) if el.tag == "serial"), len(devices)) if filesystems else 0
    for offset, fs in enumerate(filesystems):
        devices.insert(at + offset, filesystem_element(fs))
