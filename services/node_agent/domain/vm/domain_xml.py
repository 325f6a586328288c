"""The libvirt domain XML of a VM slice (https://libvirt.org/formatdomain.html). Pure: no I/O.

A slice is one QEMU domain per slot allocation. Each slot brings one GPU, one NVMe controller and one
InfiniBand SR-IOV VF (passed through with VFIO when ``passthrough`` is on) and an even share of its NUMA
node's host CPUs and memory: vCPU ``i`` is pinned to host CPU ``cpuset[i]``, and memory is bound strictly
to the slots' NUMA node (optionally backed by 1 GiB huge pages from that node).

Every value is checked when a spec is built (``ValueError`` naming the field), and every text reaches
the XML through ElementTree, which escapes it; text that XML 1.0 cannot carry (control characters) is
refused rather than written. Tessera marks its domains with ``<tessera:instance>`` under ``<metadata>``
(``TESSERA_NS``); ``parse_metadata`` finds it again, and a domain without it is not Tessera's.
"""
from __future__ import annotations

import hashlib
import re
import uuid as _uuid
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from .filesystems import Filesystem, add_filesystems

TESSERA_NS = "https://tessera.dev/xmlns/libvirt/instance/1"
ET.register_namespace("tessera", TESSERA_NS)   # idempotent; only the prefix ElementTree writes

_PCI = re.compile(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([01][0-9a-fA-F])\.([0-7])")
_GUID = re.compile(r"[0-9a-fA-F]{4}(:?[0-9a-fA-F]{4}){3}")
_MAC = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")
_MACHINE = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")      # Linux IFNAMSIZ - 1
_DOMAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_XML_NAME = re.compile(r"(?!(?i:xml))[A-Za-z_][A-Za-z0-9_.-]*")
# what XML 1.0 can carry and a parser gives back unchanged (a bare CR would come back as LF)
_XML_TEXT = re.compile("[\t\n\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")
DOMAIN_TYPES = ("kvm", "qemu")


def _check_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not _XML_TEXT.fullmatch(value):
        raise ValueError(f"{what}: expected text without control characters, got {value!r}")
    return value


def _check_path(value: object, what: str) -> str:
    if not _check_text(value, what).startswith("/"):
        raise ValueError(f"{what}: expected an absolute path, got {value!r}")
    return value


def _check(pattern: re.Pattern, value: object, what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{what}: malformed {value!r}")
    return value


def _check_count(value: object, what: str, least: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{what}: expected an integer >= {least}, got {value!r}")
    return value


@dataclass(frozen=True)
class SlotDevices:
    """One slot's devices and share, as the approved slot map lists it. PCI addresses "dddd:bb:ss.f"."""
    index: int
    gpu_pci: str
    nvme_pci: str
    ib_vf_pci: str
    ib_guid: str
    numa: int
    cpu_cores: int
    memory_gb: int

    def __post_init__(self) -> None:
        for f in ("gpu_pci", "nvme_pci", "ib_vf_pci"):
            _check(_PCI, getattr(self, f), f"slot {self.index} {f}")
        _check(_GUID, self.ib_guid, f"slot {self.index} ib_guid")
        for f in ("index", "numa", "cpu_cores", "memory_gb"):
            _check_count(getattr(self, f), f"slot {self.index} {f}")

    @classmethod
    def from_slot(cls, slot) -> SlotDevices:
        """The devices of a scheduler ``SlotDef`` (or anything with the same attributes)."""
        return cls(slot.index, slot.gpu_pci, slot.nvme_pci, slot.ib_vf_pci, slot.ib_guid, slot.numa,
                   slot.cpu_cores, slot.memory_gb)


@dataclass(frozen=True)
class Nic:
    """The tenant NIC (virtio). With ``bridge`` libvirt plugs the tap into it; without, libvirt only
    creates the tap (type 'ethernet') and something else plugs it in (e.g. a bridge in another netns)."""
    mac: str
    tap: str
    bridge: str | None = None

    def __post_init__(self) -> None:
        _check(_MAC, self.mac, "nic mac")
        _check(_IFNAME, self.tap, "nic tap")
        if self.bridge is not None:
            _check(_IFNAME, self.bridge, "nic bridge")


@dataclass(frozen=True)
class BootFiles:
    """Direct kernel boot."""
    kernel: str
    initrd: str | None
    cmdline: str

    def __post_init__(self) -> None:
        _check_path(self.kernel, "boot kernel")
        if self.initrd is not None:
            _check_path(self.initrd, "boot initrd")
        _check_text(self.cmdline, "boot cmdline")


@dataclass(frozen=True)
class DomainSpec:
    """Everything ``domain_xml`` writes. ``cpuset`` empty = no vCPU pinning (else vCPU i runs on host CPU
    ``cpuset[i]``); ``emulator_cpuset`` empty = the emulator threads share ``cpuset``; ``numa_node`` None =
    no numatune; ``boot`` None = boot from ``disk``; ``passthrough`` off = no device of ``slots`` is
    written (the slots never size the domain: ``memory_mib`` and ``vcpus`` do, see ``slot_resources``)."""
    name: str
    uuid: str
    domain_type: str
    memory_mib: int
    vcpus: int
    cpuset: tuple[int, ...]
    emulator_cpuset: tuple[int, ...]
    numa_node: int | None
    hugepages_1g: bool
    slots: tuple[SlotDevices, ...]
    passthrough: bool
    nic: Nic | None
    disk: str
    seed_iso: str | None
    boot: BootFiles | None
    console_log: str
    console_socket: str | None
    metadata: Mapping[str, str]
    machine: str = "pc"
    filesystems: tuple[Filesystem, ...] = ()   # virtiofs volumes (filesystems.py); they share the memory
    shared_memory: bool = False                # shared even without volumes: one can be attached live

    def __post_init__(self) -> None:
        _check(_DOMAIN_NAME, self.name, "name")
        try:
            _uuid.UUID(str(self.uuid))
        except ValueError:
            raise ValueError(f"uuid: malformed {self.uuid!r}") from None
        if self.domain_type not in DOMAIN_TYPES:
            raise ValueError(f"domain_type: expected one of {DOMAIN_TYPES}, got {self.domain_type!r}")
        _check_count(self.memory_mib, "memory_mib", 1)
        _check_count(self.vcpus, "vcpus", 1)
        for cpu in (*self.cpuset, *self.emulator_cpuset):
            _check_count(cpu, "host CPU")
        if self.cpuset and len(self.cpuset) != self.vcpus:
            raise ValueError(f"cpuset: {len(self.cpuset)} host CPUs for {self.vcpus} vCPUs (one each)")
        if self.numa_node is not None:
            _check_count(self.numa_node, "numa_node")
        if self.hugepages_1g and self.memory_mib % 1024:
            raise ValueError(f"memory_mib: {self.memory_mib} is not whole 1 GiB huge pages")
        _check(_MACHINE, self.machine, "machine")
        _check_path(self.disk, "disk")
        for f in ("seed_iso", "console_socket"):
            if getattr(self, f) is not None:
                _check_path(getattr(self, f), f)
        _check_path(self.console_log, "console_log")
        for key, value in self.metadata.items():
            _check(_XML_NAME, key, "metadata key")
            _check_text(value, f"metadata {key}")


def domain_name(allocation_id: _uuid.UUID | str) -> str:
    """The libvirt name of an allocation's domain: ``tessera-<32 hex digits>``."""
    return "tessera-" + _uuid.UUID(str(allocation_id)).hex


def ib_vf_mac(guid: str) -> str:
    """A deterministic, locally administered unicast MAC for the VF with this port GUID
    ("xxxx:xxxx:xxxx:xxxx" or 16 hex digits). Raises ValueError for a malformed GUID."""
    norm = _check(_GUID, guid, "ib guid").lower().replace(":", "")
    octets = bytearray(hashlib.sha256(norm.encode()).digest()[:6])
    octets[0] = (octets[0] & 0xFC) | 0x02
    return ":".join(f"{b:02x}" for b in octets)


def pin_cpus(numa_cpus: Sequence[int], slot_positions: Sequence[int], cores_per_slot: int) -> tuple[int, ...]:
    """The host CPUs of the slots at ``slot_positions`` (each slot's 0-based position among the slots of
    its NUMA node, in index order): position p owns ``numa_cpus[p*cores_per_slot:(p+1)*cores_per_slot]``.
    Raises ValueError when the NUMA node has too few CPUs, or for a repeated or negative position.

    The slice is taken in the order given (sorted CPU ids from sysfs), so on an SMT host a slot's
    CPUs may be the siblings of another slot's; the slots still never share a CPU."""
    _check_count(cores_per_slot, "cores_per_slot", 1)
    if len(set(slot_positions)) != len(slot_positions):
        raise ValueError(f"slot positions repeat: {list(slot_positions)}")
    out: list[int] = []
    for p in slot_positions:
        _check_count(p, "slot position")
        chunk = numa_cpus[p * cores_per_slot:(p + 1) * cores_per_slot]
        if len(chunk) < cores_per_slot:
            raise ValueError(f"slot position {p} needs host CPUs #{p * cores_per_slot}..#{(p + 1) * cores_per_slot - 1} "
                             f"of its NUMA node, which has only {len(numa_cpus)}")
        out.extend(chunk)
    return tuple(out)


@dataclass(frozen=True)
class SlotResources:
    """What an allocation's slots give its domain: DomainSpec's sizing and placement fields."""
    memory_mib: int
    vcpus: int
    cpuset: tuple[int, ...]
    emulator_cpuset: tuple[int, ...]
    numa_node: int | None


def slot_resources(slots: Sequence[SlotDevices], host_slots: Sequence, numa_cpus: Mapping[int, Sequence[int]]) -> SlotResources:
    """Memory, vCPUs and pinning of an allocation holding ``slots``, on a host whose slot map is
    ``host_slots`` (anything with ``index`` and ``numa``: it fixes each slot's position on its NUMA node)
    and whose NUMA node n has host CPUs ``numa_cpus[n]``. Raises ValueError when a slot is not in the
    host's map, or the host lacks its CPUs (then only ``fit_to_host`` can start it).

    vCPUs follow the slots in index order, each pinned to its own slot's CPUs; the emulator threads may
    run on any of the allocation's CPUs (the slots own their NUMA node's cores, none are left over).
    Memory is bound to the slots' NUMA node. Slots spanning NUMA nodes (an allocation larger than a node)
    get ``numa_node`` None: no numatune, so memory comes from any node (on the two-socket hosts Tessera
    knows such an allocation spans every node anyway) while each vCPU stays on its slot's node."""
    if not slots:
        raise ValueError("an allocation needs at least one slot")
    if len({s.index for s in slots}) != len(slots):
        raise ValueError(f"slots repeat: {[s.index for s in slots]}")
    cpuset: list[int] = []
    for s in sorted(slots, key=lambda s: s.index):
        on_node = sorted(h.index for h in host_slots if h.numa == s.numa)
        if s.index not in on_node:
            raise ValueError(f"slot {s.index} is not in the host's slot map on NUMA node {s.numa}")
        if s.numa not in numa_cpus:
            raise ValueError(f"slot {s.index}: the host has no NUMA node {s.numa}")
        cpuset.extend(pin_cpus(numa_cpus[s.numa], [on_node.index(s.index)], s.cpu_cores))
    nodes = {s.numa for s in slots}
    return SlotResources(memory_mib=sum(s.memory_gb for s in slots) * 1024, vcpus=len(cpuset),
                         cpuset=tuple(cpuset), emulator_cpuset=tuple(sorted(cpuset)),
                         numa_node=nodes.pop() if len(nodes) == 1 else None)


def fit_to_host(spec: DomainSpec, *, memory_mib: int, vcpus: int) -> DomainSpec:
    """``spec`` cut down to start on a host without the slots' hardware: no passed-through devices, no
    pinning, numatune or huge pages, and at most ``memory_mib`` / ``vcpus``. The slots stay in the spec
    (nothing writes them without passthrough); the caller records that passthrough was simulated."""
    return replace(spec, passthrough=False, cpuset=(), emulator_cpuset=(), numa_node=None, hugepages_1g=False,
                   memory_mib=min(spec.memory_mib, _check_count(memory_mib, "memory_mib", 1)),
                   vcpus=min(spec.vcpus, _check_count(vcpus, "vcpus", 1)))


def _cpulist(cpus: Sequence[int]) -> str:
    """"0-3,8" for [0, 1, 2, 3, 8]."""
    ranges: list[list[int]] = []
    for c in sorted(set(cpus)):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    el.text = text
    return el


def _pci_address(parent: ET.Element, pci: str, **extra: str) -> None:
    dom, bus, slot, fn = _PCI.fullmatch(pci).groups()
    _sub(parent, "address", **extra, domain=f"0x{dom}", bus=f"0x{bus}", slot=f"0x{slot}", function=f"0x{fn}")


def _resources(root: ET.Element, spec: DomainSpec) -> None:
    _sub(root, "memory", str(spec.memory_mib), unit="MiB")
    _sub(root, "vcpu", str(spec.vcpus), placement="static")
    if spec.cpuset or spec.emulator_cpuset:
        tune = _sub(root, "cputune")
        for i, cpu in enumerate(spec.cpuset):
            _sub(tune, "vcpupin", vcpu=str(i), cpuset=str(cpu))
        _sub(tune, "emulatorpin", cpuset=_cpulist(spec.emulator_cpuset or spec.cpuset))
    if spec.numa_node is not None:
        _sub(_sub(root, "numatune"), "memory", mode="strict", nodeset=str(spec.numa_node))
    if spec.hugepages_1g:   # a page's nodeset names *guest* NUMA cells (libvirt refuses host node 1 with
        # "hugepages: node 1 not found"); the host node of the pages is the numatune's
        _sub(_sub(_sub(root, "memoryBacking"), "hugepages"), "page", size="1", unit="GiB")


def _os_and_cpu(root: ET.Element, spec: DomainSpec) -> None:
    os_el = _sub(root, "os")
    _sub(os_el, "type", "hvm", arch="x86_64", machine=spec.machine)
    if spec.boot is None:
        _sub(os_el, "boot", dev="hd")
    else:
        _sub(os_el, "kernel", spec.boot.kernel)
        if spec.boot.initrd is not None:
            _sub(os_el, "initrd", spec.boot.initrd)
        _sub(os_el, "cmdline", spec.boot.cmdline)
    _sub(_sub(root, "features"), "acpi")
    if spec.domain_type == "kvm":
        cpu = _sub(root, "cpu", mode="host-passthrough", check="none")
        if spec.passthrough:     # GPUs with very large BARs need the host's physical address width
            _sub(cpu, "maxphysaddr", mode="passthrough")
    else:                        # TCG cannot pass the host CPU through; QEMU's "max" is its richest model
        _sub(root, "cpu", mode="maximum", check="none")
    for event, action in (("on_poweroff", "destroy"), ("on_reboot", "restart"), ("on_crash", "destroy")):
        _sub(root, event, action)


def _passthrough(devices: ET.Element, slot: SlotDevices) -> None:
    for pci in (slot.gpu_pci, slot.nvme_pci):
        hostdev = _sub(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
        _sub(hostdev, "driver", name="vfio")
        _pci_address(_sub(hostdev, "source"), pci)
    vf = _sub(devices, "interface", type="hostdev", managed="yes")
    _sub(vf, "mac", address=ib_vf_mac(slot.ib_guid))
    _sub(vf, "driver", name="vfio")
    _pci_address(_sub(vf, "source"), slot.ib_vf_pci, type="pci")


def _devices(root: ET.Element, spec: DomainSpec) -> None:
    devices = _sub(root, "devices")
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2")
    _sub(disk, "source", file=spec.disk)
    _sub(disk, "target", dev="vda", bus="virtio")
    if spec.seed_iso is not None:    # IDE: machine 'pc', and the cloud kernel has no AHCI
        seed = _sub(devices, "disk", type="file", device="cdrom")
        _sub(seed, "driver", name="qemu", type="raw")
        _sub(seed, "source", file=spec.seed_iso)
        _sub(seed, "target", dev="hdc", bus="ide")
        _sub(seed, "readonly")
    if spec.nic is not None:
        nic = _sub(devices, "interface", type="ethernet" if spec.nic.bridge is None else "bridge")
        _sub(nic, "mac", address=spec.nic.mac)
        if spec.nic.bridge is None:
            _sub(nic, "target", dev=spec.nic.tap, managed="yes")
        else:
            _sub(nic, "source", bridge=spec.nic.bridge)
            _sub(nic, "target", dev=spec.nic.tap)
        _sub(nic, "model", type="virtio")
    if spec.passthrough:
        for slot in spec.slots:
            _passthrough(devices, slot)
    serial = _sub(devices, "serial", type="file")
    _sub(serial, "source", path=spec.console_log, append="on")
    _sub(serial, "target", port="0")
    console = _sub(devices, "console", type="file")
    _sub(console, "source", path=spec.console_log, append="on")
    _sub(console, "target", type="serial", port="0")
    if spec.console_socket is not None:
        sock = _sub(devices, "serial", type="unix")
        _sub(sock, "source", mode="bind", path=spec.console_socket)
        _sub(sock, "target", port="1")
    _sub(devices, "memballoon", model="none")   # no <graphics>: libvirt 9.0 refuses type='none'


def domain_xml(spec: DomainSpec) -> str:
    """The domain XML of ``spec`` (a str, no XML declaration)."""
    root = ET.Element("domain", type=spec.domain_type)
    _sub(root, "name", spec.name)
    _sub(root, "uuid", str(_uuid.UUID(str(spec.uuid))))
    instance = _sub(_sub(root, "metadata"), f"{{{TESSERA_NS}}}instance")
    for key, value in spec.metadata.items():
        _sub(instance, f"{{{TESSERA_NS}}}{key}", value)
    _resources(root, spec)
    _os_and_cpu(root, spec)
    _devices(root, spec)
    add_filesystems(root, spec.filesystems, spec.shared_memory)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode")


def parse_metadata(xml: str) -> dict[str, str] | None:
    """Tessera's metadata in a domain XML (as ``domain_xml`` wrote it, or libvirt's XMLDesc of it), or
    None when the domain is not Tessera's. Raises ValueError for text that is not XML."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise ValueError(f"not a domain XML: {exc}") from None
    instance = root.find(f"metadata/{{{TESSERA_NS}}}instance")
    if instance is None:
        return None
    prefix = f"{{{TESSERA_NS}}}"
    return {el.tag[len(prefix):]: el.text or "" for el in instance if el.tag.startswith(prefix)}
