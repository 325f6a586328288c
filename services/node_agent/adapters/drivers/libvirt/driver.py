"""The libvirt driver: one persistent QEMU domain per slot allocation, booted from the tenant's image with a
cloud-init NoCloud seed, its NIC a tap the node plugs into the tenant network's bridge.

libvirt-python is imported lazily, inside the driver's worker threads only; every libvirt call blocks and runs
on the driver's own small thread pool, never on the event loop. The domain XML is pure
(``domain.vm.domain_xml``); this module runs it: image (``images``), overlay, seed ISO (``seed``), define,
start, then waits for the guest's ready line on its serial console (``boot``). Any failure before the guest is ready
removes everything made (domain, overlay, seed, files) and raises ``DriverError`` with the reason — the
console's last lines when the guest never said it was ready.

Volumes (``volumes``): each btrfs volume is a virtiofs device the guest mounts at /mnt/<name> before it is ready;
a read-only one is shared through a read-only bind mount on the host; volumes can be attached and detached live.

Domains carry Tessera's metadata (allocation, tenant, node, image, slots); the driver lists, changes and
removes only domains whose metadata names its own node, so several node-agents may share one libvirtd (the
test lab) and nothing foreign is ever touched.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import structlog

from shared.settings import SettingError, load

from ....domain.model import Instance, InstanceSpec
from ....domain.vm import cloudinit
from ....domain.vm.domain_xml import (
    BootFiles,
    DomainSpec,
    Nic,
    domain_name,
    domain_xml,
    fit_to_host,
    parse_metadata,
    slot_resources,
)
from ..base import BmcSource, Console, DriverConfigError, DriverError, InstanceStarted, PowerAction, ProvisioningDriver
from ..volumes import VolumeConfig
from . import boot, host, images
from .config import LibvirtConfig
from .seed import write_seed_iso
from .volumes import LibvirtVolumes, Views

log = structlog.get_logger()


class LibvirtDriver(LibvirtVolumes, ProvisioningDriver):
    name = "libvirt"
    persistent = True
    guest_ports = True

    def __init__(self, config: LibvirtConfig, volumes: VolumeConfig | None = None):
        self.config = config
        self.views = Views(volumes or VolumeConfig())
        self.node_id: uuid.UUID | None = None
        self._topology: Callable[[], dict] | None = None
        self._instance_started: InstanceStarted | None = None
        self._host_slots: list | None = None
        self._conn = None
        self._pool = ThreadPoolExecutor(4, "libvirt")
        self._locks: dict[uuid.UUID, asyncio.Lock] = {}   # one operation per allocation at a time (racing calls)

    @property
    def devices_simulated(self) -> bool:   # passthrough off: the slots' devices are not on this host
        return not self.config.passthrough

    def _lock(self, allocation_id: uuid.UUID) -> asyncio.Lock:
        if len(self._locks) > 1024:   # forget idle ones
            self._locks = {a: lk for a, lk in self._locks.items() if lk.locked()}
        return self._locks.setdefault(allocation_id, asyncio.Lock())

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> LibvirtDriver:
        try:
            return cls(load(LibvirtConfig, environ), VolumeConfig.from_env(environ))
        except SettingError as exc:
            raise DriverConfigError(str(exc)) from None

    def bind(self, node_id: uuid.UUID, topology: Callable[[], dict], *, instance_started: InstanceStarted | None = None,
             bmc: BmcSource | None = None) -> None:
        self.node_id, self._topology, self._instance_started = node_id, topology, instance_started

    # -- libvirt, on the driver's threads ---------------------------------------------------------------
    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _libvirt(self):
        import libvirt  # lazily: only a node that runs this driver needs the binding
        if not getattr(libvirt, "_tessera_quiet", False):
            # libvirt prints every error to stderr by default; each becomes a DriverError (or is expected, as a
            # lookup of a domain not made yet), logged as JSON where it matters
            libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
            libvirt._tessera_quiet = True
        return libvirt

    def conn(self):
        """The hypervisor connection, (re)opened when missing or dead; raises DriverError naming the URI."""
        libvirt = self._libvirt()
        if self._conn is not None:
            try:
                self._conn.getLibVersion()   # one cheap round trip: a restarted libvirtd left this one dead
                return self._conn
            except libvirt.libvirtError:
                self._conn = None
        try:
            self._conn = libvirt.open(self.config.uri)
            return self._conn
        except libvirt.libvirtError as exc:
            self._conn = None
            raise DriverError(f"libvirt at {self.config.uri} is unreachable: {exc.get_error_message()}") from None

    def _errors(self, what: str, fn, *args):
        libvirt = self._libvirt()
        try:
            return fn(*args)
        except libvirt.libvirtError as exc:
            raise DriverError(f"{what}: libvirt: {exc.get_error_message()}") from None

    def _ours(self, dom) -> dict | None:
        meta = parse_metadata(dom.XMLDesc(0))
        return meta if meta is not None and meta.get("node_id") == str(self.node_id) else None

    def _lookup(self, allocation_id: uuid.UUID):
        """This node's domain of the allocation, or None."""
        libvirt = self._libvirt()
        try:
            dom = self.conn().lookupByName(self.name_of(allocation_id))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise DriverError(f"libvirt: {exc.get_error_message()}") from None
        return dom if self._ours(dom) is not None else None

    def name_of(self, allocation_id: uuid.UUID) -> str:
        """The allocation's domain name on this node: ``tessera-<hex>``, with the node's suffix when it shares its
        libvirtd with other nodes (``LibvirtConfig.name_suffix``)."""
        suffix = self.config.name_suffix
        return domain_name(allocation_id) + (f"-{suffix}" if suffix else "")

    def uuid_of(self, allocation_id: uuid.UUID) -> str:
        """The domain's UUID: the allocation's, or one derived from it and the node's suffix (a libvirtd holds
        one domain per UUID)."""
        suffix = self.config.name_suffix
        return str(uuid.uuid5(uuid.UUID(str(allocation_id)), suffix) if suffix else allocation_id)

    def dir_of(self, allocation_id: uuid.UUID) -> Path:
        return self.config.state_dir / self.name_of(allocation_id)

    def socket_of(self, allocation_id: uuid.UUID) -> Path:
        """The guest's interactive serial console (ttyS1), a UNIX socket only root on the node can open."""
        return self.config.socket_dir / f"{self.name_of(allocation_id)}.sock"

    # -- the domain's XML -------------------------------------------------------------------------------
    def host_slots(self) -> list:
        """(index, numa) of every slot of the node, from its discovered topology (slot i is GPU i)."""
        if self._host_slots is None:
            topology = self._topology() if self._topology else {"gpus": [], "numa_nodes": []}
            self._host_slots = [type("HostSlot", (), {"index": g["index"], "numa": g["numa"]})
                                for g in topology.get("gpus", [])]
            self._numa_nodes = [type("Numa", (), n) for n in topology.get("numa_nodes", [])]
        return self._host_slots

    def _spec(self, spec: InstanceSpec, base: Path, files: Path, filesystems=()) -> tuple[DomainSpec, DomainSpec]:
        """(the domain as the slot map asks, the domain this host starts): equal with passthrough on."""
        guest, nic = spec.guest, spec.nic
        host_slots = self.host_slots()
        numa = host.numa_cpus() if self.config.passthrough else host.sim_numa_cpus(self._numa_nodes)
        res = slot_resources(spec.resources, host_slots, numa)
        hugepages = self.config.passthrough and res.numa_node is not None and \
            host.hugepages_1g(numa=res.numa_node) * 1024 >= res.memory_mib
        boot = BootFiles(images.boot_file(guest.image.kernel, self.config.images_dir, guest.image.name),
                         images.boot_file(guest.image.initrd, self.config.images_dir, guest.image.name),
                         guest.image.kernel_args or "console=ttyS0") if guest.image.kernel else None
        meta = {"allocation_id": str(spec.allocation_id), "tenant_id": str(spec.tenant_id),
                "node_id": str(spec.node_id), "image": guest.image.name, "hostname": guest.hostname,
                "slots": ",".join(map(str, spec.slots)),
                "passthrough": "real" if self.config.passthrough else "simulated"}
        full = DomainSpec(
            name=self.name_of(spec.allocation_id), uuid=self.uuid_of(spec.allocation_id),
            domain_type=self.config.domain_type,
            memory_mib=res.memory_mib, vcpus=res.vcpus, cpuset=res.cpuset, emulator_cpuset=res.emulator_cpuset,
            numa_node=res.numa_node, hugepages_1g=bool(hugepages), slots=tuple(spec.resources), passthrough=True,
            nic=Nic(nic.mac, nic.port, None) if nic else None, disk=str(files / "overlay.qcow2"),
            seed_iso=str(files / "seed.iso"), boot=boot, console_log=str(files / "console.log"),
            console_socket=str(self.socket_of(spec.allocation_id)), metadata=meta, filesystems=filesystems,
            shared_memory=self.config.volume_hotplug)
        if self.config.passthrough:
            return full, full
        return full, fit_to_host(full, memory_mib=self.config.sim_memory_mib, vcpus=self.config.sim_vcpus)

    # -- provision --------------------------------------------------------------------------------------
    def _create(self, spec: InstanceSpec) -> tuple[str, bool]:
        """Define and start the domain (blocking); (name, True) when this call started it. Cleans up on failure."""
        dom = self._lookup(spec.allocation_id)
        if dom is not None:
            if not dom.isActive():
                self.restore_volumes(spec.allocation_id)
                self._errors("start", dom.create)
            return dom.name(), False
        if spec.guest is None:
            raise DriverError("no image: the allocation names none and the catalog has no default image")
        if not spec.resources:
            raise DriverError("no slot devices in the command: the scheduler's reservation carries them")
        files = self.dir_of(spec.allocation_id)
        began = time.time()
        try:
            files.mkdir(parents=True, exist_ok=True)
            self.config.socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            base = images.ensure(spec.guest.image, self.config.images_dir)
            filesystems, mounts = self.prepare_volumes(spec)
            full, started = self._spec(spec, base, files, filesystems)
            (files / "domain-full.xml").write_text(domain_xml(full))
            xml = domain_xml(started)
            (files / "domain.xml").write_text(xml)
            images.overlay(base, spec.guest.image.format, files / "overlay.qcow2", spec.guest.image.min_disk_gb)
            if spec.nic is not None:
                write_seed_iso(files / "seed.iso", cloudinit.Seed(
                    instance_id=str(spec.allocation_id), hostname=spec.guest.hostname, ssh_keys=spec.guest.ssh_keys,
                    mac=spec.nic.mac, ip_address=spec.nic.ip_address, prefix_len=spec.nic.prefix_len,
                    gateway=spec.nic.gateway, dns=spec.guest.dns or self.config.dns, mtu=spec.nic.mtu, mounts=mounts))
            else:
                raise DriverError("no network attachment: a VM slice needs its tenant network")
            prepared = time.time()
            dom = self._errors("define the domain", self.conn().defineXML, xml)
            self._errors("start the domain", dom.create)
            started = time.time()
            (files / "instance.json").write_text(json.dumps({
                "started_at": started, "prepare_s": round(prepared - began, 3), "start_s": round(started - prepared, 3),
                "image": spec.guest.image.name, "hostname": spec.guest.hostname,
                "passthrough": full.metadata["passthrough"],
                "addresses": [spec.nic.interface]}))
            return dom.name(), True
        except (images.ImageError, ValueError, OSError) as exc:
            self._remove(spec.allocation_id)
            raise DriverError(str(exc)) from None
        except BaseException:
            self._remove(spec.allocation_id)
            raise

    async def provision(self, spec: InstanceSpec) -> str:
        async with self._lock(spec.allocation_id):
            return await self._provision(spec)

    async def _provision(self, spec: InstanceSpec) -> str:
        name, created = await self._call(self._create, spec)
        try:
            if self._instance_started is not None:
                await self._instance_started(spec.allocation_id)
            await self._wait_ready(spec.allocation_id)
        except BaseException:
            await self._call(self._remove, spec.allocation_id)
            raise
        log.info("libvirt.provisioned", domain=name, created=created)
        return name

    async def _wait_ready(self, allocation_id: uuid.UUID) -> None:
        await boot.wait_ready(self.dir_of(allocation_id), self.config.boot_timeout_s,
                              partial(self._call, self._active, allocation_id))

    def _active(self, allocation_id: uuid.UUID) -> bool:
        """Whether the allocation's domain runs: polled during a boot, so by name only (no XML read; the name is
        the allocation's, made by this driver)."""
        libvirt = self._libvirt()
        try:
            return bool(self.conn().lookupByName(self.name_of(allocation_id)).isActive())
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return False
            raise DriverError(f"libvirt: {exc.get_error_message()}") from None

    # -- deprovision ------------------------------------------------------------------------------------
    def _remove(self, allocation_id: uuid.UUID) -> None:
        """Destroy and undefine the domain (if any) and remove its files; without files and without a reachable
        libvirt there is nothing of the allocation here (a failed provision removed what it made)."""
        files = self.dir_of(allocation_id)
        try:
            dom = self._lookup(allocation_id)
        except DriverError:
            if not files.exists():
                return
            raise
        if dom is not None:
            libvirt = self._libvirt()
            if dom.isActive():
                self._errors("power off", dom.destroy)
            try:
                dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                    raise DriverError(f"undefine: libvirt: {exc.get_error_message()}") from None
        self.release_volumes(allocation_id)   # virtiofsd ended with the domain: nothing uses the views any more
        shutil.rmtree(files, ignore_errors=True)
        self.socket_of(allocation_id).unlink(missing_ok=True)

    async def deprovision(self, allocation_id: uuid.UUID) -> None:
        async with self._lock(allocation_id):
            await self._call(self._remove, allocation_id)

    # -- what runs here ---------------------------------------------------------------------------------
    def _list(self) -> list[Instance]:
        libvirt = self._libvirt()
        found = []
        for dom in self._errors("list domains", self.conn().listAllDomains, 0):
            try:
                meta = self._ours(dom)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    continue   # removed between the listing and the read: not running here any more
                raise DriverError(f"read domain {dom.name()}: libvirt: {exc.get_error_message()}") from None
            if meta is not None:
                slots = tuple(int(s) for s in meta.get("slots", "").split(",") if s)
                found.append(Instance(uuid.UUID(meta["allocation_id"]), dom.name(), slots))
        return found

    async def list_instances(self) -> list[Instance]:
        return await self._call(self._list)

    def _one(self, allocation_id: uuid.UUID) -> Instance | None:
        dom = self._lookup(allocation_id)
        if dom is None:
            return None
        slots = tuple(int(s) for s in parse_metadata(dom.XMLDesc(0)).get("slots", "").split(",") if s)
        return Instance(allocation_id, dom.name(), slots)

    async def instance_of(self, allocation_id: uuid.UUID) -> Instance | None:
        return await self._call(self._one, allocation_id)

    def _info(self, allocation_id: uuid.UUID) -> dict:
        try:
            info = json.loads((self.dir_of(allocation_id) / "instance.json").read_text())
        except (OSError, ValueError):
            return {"passthrough": "simulated" if not self.config.passthrough else "real"}
        ready = info.get("ready_at")
        return {"passthrough": info["passthrough"], "image": info.get("image"), "hostname": info.get("hostname"),
                "booted_at": datetime.fromtimestamp(ready, UTC).isoformat() if ready else None,
                "boot_s": round(ready - info["started_at"], 3) if ready else None,
                "prepare_s": info.get("prepare_s"), "start_s": info.get("start_s"),
                "power_state": "running" if self._active(allocation_id) else "stopped",
                "mounts": self.volume_info(allocation_id), "addresses": info.get("addresses", [])}

    async def instance_info(self, allocation_id: uuid.UUID) -> dict:
        return await self._call(self._info, allocation_id)

    # -- tenant operations ------------------------------------------------------------------------------
    def _power(self, allocation_id: uuid.UUID, action: PowerAction) -> tuple[str, bool]:
        """(power state after, whether the domain was started by this call); blocking."""
        dom = self._lookup(allocation_id)
        if dom is None:
            raise DriverError(f"no instance of allocation {allocation_id} on this node")
        if action == "stop":
            if dom.isActive():
                self._errors("shut down", dom.shutdown)
                deadline = time.monotonic() + self.config.shutdown_timeout_s
                while dom.isActive() and time.monotonic() < deadline:
                    time.sleep(0.1)
                if dom.isActive():
                    self._errors("power off", dom.destroy)
            return "stopped", False
        if dom.isActive():
            if action == "reboot":
                self._errors("reset", dom.reset, 0)
            return "running", False
        self.restore_volumes(allocation_id)
        self._errors("start", dom.create)
        return "running", True

    async def power(self, allocation_id: uuid.UUID, action: PowerAction) -> str:
        async with self._lock(allocation_id):
            state, started = await self._call(self._power, allocation_id, action)
            if started and self._instance_started is not None:
                await self._instance_started(allocation_id)   # a fresh QEMU made a fresh tap: plug it again
        return state

    def _console(self, allocation_id: uuid.UUID, offset: int, limit: int) -> Console | None:
        path = self.dir_of(allocation_id) / "console.log"
        if self._lookup(allocation_id) is None or not path.exists():
            return None
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            start = max(0, size - limit) if offset < 0 else min(offset, size)
            f.seek(start)
            data = f.read(limit)
        return Console(start, start + len(data), data.decode(errors="replace"), self._active(allocation_id))

    async def console(self, allocation_id: uuid.UUID, offset: int, limit: int) -> Console | None:
        return await self._call(self._console, allocation_id, offset, limit)
