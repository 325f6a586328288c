"""What the VM tests share: a running libvirtd, the project's guest image, a driver on it, and what is left of an
allocation on the host (domains, files, taps). Blocking helpers; the tests call them through asyncio.to_thread."""
from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from services.node_agent.adapters.discovery.sim import sim_topology
from services.node_agent.adapters.drivers.libvirt.config import LibvirtConfig
from services.node_agent.adapters.drivers.libvirt.driver import LibvirtDriver
from services.node_agent.domain.model import BootImage, GuestConfig, InstanceSpec, NicConfig
from services.node_agent.domain.vm.domain_xml import SlotDevices, domain_name
from services.scheduler.domain.topology import derive_slot_map

__all__ = ["URI", "VM_ENV", "boot_image", "catalog_entry", "console_socket", "domain_name", "domains", "driver",
           "host_ready", "instance_spec", "leftovers"]
from tooling.guest_image.build import GuestImage, ensure_image
from tooling.libvirt_host import ensure_libvirtd

URI = "qemu:///system"
# what the suite runs VMs with: TCG (this machine's KVM hangs), no passthrough devices, small guests
VM_ENV = {"TESSERA_NODE_DRIVER": "libvirt", "TESSERA_LIBVIRT_URI": URI, "TESSERA_LIBVIRT_DOMAIN_TYPE": "qemu",
          "TESSERA_LIBVIRT_PASSTHROUGH": "off", "TESSERA_LIBVIRT_BOOT_TIMEOUT_S": "120",
          "TESSERA_LIBVIRT_SIM_MEMORY_MIB": "192"}


def host_ready() -> GuestImage:
    """libvirtd running (started if needed) and the guest image built (cached); blocks."""
    ensure_libvirtd(URI)
    return ensure_image(log=lambda _line: None)


def boot_image(image: GuestImage, **changes) -> BootImage:
    fields = {"name": image.name, "format": image.format, "source": str(image.disk), "sha256": image.sha256,
              "min_disk_gb": image.min_disk_gb, "kernel": str(image.kernel), "initrd": str(image.initrd),
              "kernel_args": image.kernel_args}
    return BootImage(**{**fields, **changes})


def instance_spec(image: GuestImage, node_id: uuid.UUID, node_name: str, *, slots=(0,), ip: str = "10.77.0.5",
                  **image_changes) -> InstanceSpec:
    """What the node-agent hands its driver for a new allocation on a sim-topology node named ``node_name``."""
    slot_map, _ = derive_slot_map(sim_topology(node_name))
    allocation = uuid.uuid4()
    mac = "52:54:00:" + ":".join(f"{b:02x}" for b in allocation.bytes[:3])
    return InstanceSpec(allocation, uuid.uuid4(), node_id, tuple(slots),
                        resources=tuple(SlotDevices.from_slot(s) for s in slot_map.slots if s.index in slots),
                        guest=GuestConfig(boot_image(image, **image_changes), f"vm-{allocation.hex[:6]}",
                                          ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDk test@tessera",)),
                        nic=NicConfig(f"tv{allocation.hex[:8]}", mac, ip, 24, "10.77.0.1"))


def catalog_entry(image: GuestImage, name: str | None = None, **changes) -> dict:
    """The body of POST /v1/images registering the guest image."""
    return {"name": name or image.name, "os": image.os, "format": image.format, "source": str(image.disk),
            "sha256": image.sha256, "min_disk_gb": image.min_disk_gb, "kernel": str(image.kernel),
            "initrd": str(image.initrd), "kernel_args": image.kernel_args, "visibility": "public", **changes}


def driver(state_dir: Path, node_id: uuid.UUID, topology: dict, **config) -> LibvirtDriver:
    d = LibvirtDriver(LibvirtConfig(uri=URI, domain_type="qemu", passthrough=False, state_dir=state_dir,
                                    sim_memory_mib=192, **config))
    d.bind(node_id, lambda: topology)
    return d


SOCKET_DIR = LibvirtConfig().socket_dir


def console_socket(allocation_id: uuid.UUID | str) -> str:
    """The guest's interactive serial console (the driver's default socket directory)."""
    return str(SOCKET_DIR / f"{domain_name(allocation_id)}.sock")


def domains() -> set[str]:
    """Every domain libvirt knows (running or not), by name."""
    out = subprocess.run(["virsh", "-c", URI, "list", "--all", "--name"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


def leftovers(allocation_id: uuid.UUID | str, state_dir: Path) -> list[str]:
    """What is left of the allocation's instance on the host: its domain, its files."""
    name = domain_name(allocation_id)
    found = [f"domain {name}"] if name in domains() else []
    if (state_dir / name).exists():
        found += [f"directory {state_dir / name}"] + [str(p) for p in (state_dir / name).iterdir()]
    return found
