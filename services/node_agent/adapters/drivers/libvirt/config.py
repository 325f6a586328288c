"""The libvirt driver's settings (read by ``LibvirtDriver.from_env``, in bootstrap; never at import time).

  TESSERA_LIBVIRT_URI               [qemu:///system] the hypervisor connection
  TESSERA_LIBVIRT_DOMAIN_TYPE       [kvm] kvm in production; qemu (TCG emulation) where KVM does not work, as on
                                    the build machine and in the test suite
  TESSERA_LIBVIRT_PASSTHROUGH       [on] off: a host without the slots' GPUs, NVMe and IB VFs (a laptop, CI):
                                    the started domain leaves the hostdevs, CPU pinning, NUMA binding and huge
                                    pages out, takes TESSERA_LIBVIRT_SIM_MEMORY_MIB and _SIM_VCPUS, and the instance
                                    says passthrough "simulated"; the full domain XML is still written beside it
  TESSERA_LIBVIRT_STATE_DIR         [/var/lib/tessera/instances] per instance: overlay, seed ISO, console, XML;
                                    images/ holds the verified images
  TESSERA_LIBVIRT_SOCKET_DIR        [/run/tessera/consoles] the guests' interactive serial consoles (UNIX sockets,
                                    root only; a socket path must stay under 108 bytes, so not in the state dir)
  TESSERA_LIBVIRT_BOOT_TIMEOUT_S    [120] start → the guest's ready line on its console, else the step fails
  TESSERA_LIBVIRT_SHUTDOWN_TIMEOUT_S [5] a stop asks the guest (ACPI) this long, then powers it off
  TESSERA_LIBVIRT_SIM_MEMORY_MIB    [256] memory of a domain when passthrough is off
  TESSERA_LIBVIRT_SIM_VCPUS         [1] vCPUs of a domain when passthrough is off
  TESSERA_LIBVIRT_DNS               [] comma list of DNS servers the guests are told
  TESSERA_LIBVIRT_VOLUME_HOTPLUG    [on] every domain's memory is shared (a memfd), so a volume can be attached
                                    to it live (virtio-fs needs it); off: only domains booted with a volume share it,
                                    and a live attach to another is refused with libvirt's reason
  TESSERA_LIBVIRT_DETACH_TIMEOUT_S  [15] a live detach waits this long for the guest to release the device
  TESSERA_LIBVIRT_NAME_SUFFIX       [] appended to every domain's name and mixed into its UUID: a lab that runs
                                    several nodes on one libvirtd gives each its own, so that an allocation moved
                                    from one of them to another (a reschedule) never meets its old domain's name;
                                    empty in production, where a node is a host

The volume roots and the node's volume state (TESSERA_VOLUME_ROOTS, TESSERA_VOLUME_STATE_DIR) are every
driver's: ``adapters.drivers.volumes``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from shared.settings import choice, flag, integer, number, setting


def _dns(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _suffix(raw: str) -> str:
    if raw and not re.fullmatch(r"[a-z0-9]{1,16}", raw):
        raise ValueError(raw)
    return raw


@dataclass(frozen=True)
class LibvirtConfig:
    uri: str = setting("TESSERA_LIBVIRT_URI", "qemu:///system", doc="the hypervisor connection")
    domain_type: str = setting("TESSERA_LIBVIRT_DOMAIN_TYPE", "kvm", choice("kvm", "qemu"),
                               doc="kvm, or qemu (TCG) where KVM does not work")
    passthrough: bool = setting("TESSERA_LIBVIRT_PASSTHROUGH", True, flag,
                                doc="off: the host lacks the devices; the domain runs without them")
    state_dir: Path = setting("TESSERA_LIBVIRT_STATE_DIR", Path("/var/lib/tessera/instances"), Path,
                              doc="instances' overlays, seeds, consoles and XML; verified images")
    socket_dir: Path = setting("TESSERA_LIBVIRT_SOCKET_DIR", Path("/run/tessera/consoles"), Path,
                               doc="the guests' interactive serial console sockets")
    boot_timeout_s: float = setting("TESSERA_LIBVIRT_BOOT_TIMEOUT_S", 120.0, number(positive=True),
                                    doc="start → the guest's ready line")
    shutdown_timeout_s: float = setting("TESSERA_LIBVIRT_SHUTDOWN_TIMEOUT_S", 5.0, number(0.0),
                                        doc="a stop waits this long for the guest, then powers off")
    sim_memory_mib: int = setting("TESSERA_LIBVIRT_SIM_MEMORY_MIB", 256, integer(64, 1 << 20),
                                  doc="memory of a domain when passthrough is off")
    sim_vcpus: int = setting("TESSERA_LIBVIRT_SIM_VCPUS", 1, integer(1, 512), doc="vCPUs when passthrough is off")
    dns: tuple[str, ...] = setting("TESSERA_LIBVIRT_DNS", (), _dns, doc="DNS servers the guests are told")
    volume_hotplug: bool = setting("TESSERA_LIBVIRT_VOLUME_HOTPLUG", True, flag,
                                   doc="share every domain's memory, so volumes attach live")
    detach_timeout_s: float = setting("TESSERA_LIBVIRT_DETACH_TIMEOUT_S", 15.0, number(positive=True),
                                      doc="a live detach waits this long for the guest")
    name_suffix: str = setting("TESSERA_LIBVIRT_NAME_SUFFIX", "", _suffix,
                               doc="appended to domain names (several nodes on one libvirtd: one each)")

    @property
    def images_dir(self) -> Path:
        return self.state_dir / "images"
