"""A bare-metal lab on this host (the redfish driver's tests and ``./taskw up``'s bare-metal demo node): a
provisioning bridge, "servers" that are persistent libvirt domains (never started by the lab: their BMC powers
them), loop devices standing in for the servers' NVMe, and a real ``sushy-emulator`` (the BMC) in front of them
with HTTP basic auth (``tooling.sushy_emulator``).

Blocking helpers (the tests call them through ``asyncio.to_thread``); everything needs root and a running
libvirtd (``tooling.libvirt_host.ensure_libvirtd``). ``BmcLab.stop()`` removes everything ``start()`` made, in
reverse, and is safe after a partial start.
"""
from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import quoteattr

from services.node_agent.adapters.drivers.redfish.bmc import BmcConfig

from .bmc_leaf import DEFAULT_VTEP, ServerLeaf, hca_guid
from .leaf_lab import LeafLab
from .sushy_emulator import SEABIOS, URI, USERNAME, SushyEmulator, free_port  # noqa: F401 - the tests' imports


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _libvirt():
    import libvirt  # lazily: only the root tests with a libvirtd import this module's users
    return libvirt


# -- the provisioning network --------------------------------------------------------------------------------
def free_subnet() -> int:
    """n such that 172.30.n.0/24 is on no interface of this host (100-199, random)."""
    used = _run("ip", "-o", "-4", "addr", "show").stdout
    for _ in range(100):
        n = 100 + secrets.randbelow(100)
        if f" 172.30.{n}." not in used:
            return n
    raise RuntimeError("no free 172.30.n.0/24 subnet for a provisioning bridge")


def make_bridge(name: str, address: str) -> None:
    """A Linux bridge ``name`` with ``address`` (e.g. 172.30.9.1/24), up."""
    _run("ip", "link", "add", name, "type", "bridge")
    _run("ip", "addr", "add", address, "dev", name)
    _run("ip", "link", "set", name, "up")


def remove_bridge(name: str) -> None:
    _run("ip", "link", "del", name, check=False)


# -- disks ----------------------------------------------------------------------------------------------------
def make_loop_disk(path: Path, size_mib: int = 16) -> str:
    """A loop device over a new sparse file ``path`` of ``size_mib``; its /dev path."""
    with open(path, "wb") as f:
        f.truncate(size_mib << 20)
    return _run("losetup", "--find", "--show", str(path)).stdout.strip()


def remove_loop_disk(device: str) -> None:
    _run("losetup", "-d", device, check=False)


# -- servers ----------------------------------------------------------------------------------------------------
def server_xml(name: str, server_uuid: str, mac: str, bridge: str, console_log: Path, disks: list[str],
               shell_socket: Path | None = None) -> str:
    """A BIOS machine ``pc`` (TCG), 256 MiB, one vCPU, one virtio NIC on ``bridge``, the serial console to a file,
    one virtio disk per block device, no CD-ROM (the BMC's virtual media adds one). With ``shell_socket``, the
    second serial port (the guest image's root shell on ttyS1) is a UNIX socket QEMU listens on there."""
    shell_xml = "" if shell_socket is None else (
        f"<serial type='unix'><source mode='bind' path={quoteattr(str(shell_socket))}/><target port='1'/></serial>")
    disk_xml = "".join(
        f"<disk type='block' device='disk'><driver name='qemu' type='raw' cache='none'/>"
        f"<source dev={quoteattr(dev)}/><target dev='vd{chr(ord('a') + i)}' bus='virtio'/></disk>"
        for i, dev in enumerate(disks))
    return (
        f"<domain type='qemu'><name>{name}</name><uuid>{server_uuid}</uuid>"
        "<memory unit='MiB'>256</memory><vcpu>1</vcpu>"
        "<os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>"
        "<features><acpi/></features><on_reboot>restart</on_reboot>"
        f"<devices>{disk_xml}"
        f"<interface type='bridge'><mac address='{mac}'/><source bridge='{bridge}'/><model type='virtio'/></interface>"
        f"<serial type='file'><source path={quoteattr(str(console_log))} append='on'/><target port='0'/></serial>"
        f"<console type='file'><source path={quoteattr(str(console_log))} append='on'/><target type='serial' port='0'/>"
        f"</console>{shell_xml}</devices></domain>")


def define_server(xml: str) -> None:
    conn = _libvirt().open(URI)
    try:
        conn.defineXML(xml)
    finally:
        conn.close()


def remove_server(name: str) -> None:
    """Power off and undefine the domain ``name``; nothing when it is gone."""
    libvirt = _libvirt()
    conn = libvirt.open(URI)
    try:
        try:
            dom = conn.lookupByName(name)
        except libvirt.libvirtError:
            return
        if dom.isActive():
            dom.destroy()
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
    finally:
        conn.close()


def domain_state(name: str) -> tuple[bool, str]:
    """(running, the persistent XML) of the domain ``name``."""
    libvirt = _libvirt()
    conn = libvirt.open(URI)
    try:
        dom = conn.lookupByName(name)
        return bool(dom.isActive()), dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    finally:
        conn.close()


def make_pool(name: str, path: Path) -> None:
    """A started ``dir`` storage pool at ``path`` (sushy-emulator copies inserted media into it)."""
    conn = _libvirt().open(URI)
    try:
        pool = conn.storagePoolDefineXML(f"<pool type='dir'><name>{name}</name><target><path>{path}</path></target></pool>")
        pool.create()
    finally:
        conn.close()


def remove_pool(name: str) -> None:
    """Delete the pool's volumes, stop and undefine it; nothing when it is gone."""
    libvirt = _libvirt()
    conn = libvirt.open(URI)
    try:
        try:
            pool = conn.storagePoolLookupByName(name)
        except libvirt.libvirtError:
            return
        if pool.isActive():
            for volume in pool.listAllVolumes():
                volume.delete()
            pool.destroy()
        pool.undefine()
    finally:
        conn.close()


@dataclass
class BmcLab:
    """One server (a libvirt domain with ``disks`` loop-device disks) on its own provisioning bridge, behind a
    sushy-emulator BMC. ``start()`` makes it all, ``stop()`` removes it all (also after a failed start).

    ``fabric`` = (fabric namespace, underlay bridge): the server is cabled to a leaf switch on that underlay (VTEP
    address ``vtep``) instead of the provisioning bridge, which the leaf reaches through its uplink
    (``tooling.bmc_leaf``). ``with_server=False``: only the network (bridges, leaf), no disks, domain or BMC."""

    disks: int = 1
    disk_mib: int = 16
    password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    workdir: Path | None = None
    subnet: int = 0
    server_uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    loops: list[str] = field(default_factory=list)
    emulator: SushyEmulator | None = None
    fabric: tuple[str, str] | None = None
    vtep: str = DEFAULT_VTEP
    with_server: bool = True
    _undo: list = field(default_factory=list)
    _leaf: ServerLeaf | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.fabric is not None:
            self._leaf = ServerLeaf(self.tag, self.fabric, self.vtep)

    @property
    def server_name(self) -> str:
        return f"tessera-bm-{self.tag}"

    @property
    def bridge(self) -> str:
        return f"tbm{self.tag}"

    @property
    def pool(self) -> str:
        return f"tessera-bm-{self.tag}"

    @property
    def server_mac(self) -> str:
        return "52:54:00:" + ":".join(self.tag[i:i + 2] for i in (0, 2, 4))

    @property
    def host_address(self) -> str:
        return f"172.30.{self.subnet}.1"

    @property
    def server_address(self) -> str:
        return f"172.30.{self.subnet}.10/24"

    @property
    def console_log(self) -> Path:
        return self.workdir / "server-console.log"

    @property
    def shell_socket(self) -> Path:
        """The UNIX socket of the server's ttyS1, where the guest image keeps a root shell."""
        return self.workdir / "server-shell.sock"

    @property
    def server_system_id(self) -> str:
        return f"/redfish/v1/Systems/{self.server_uuid}"

    @property
    def leaf(self) -> LeafLab | None:
        """The leaf the server is cabled to (None: no fabric, the server is on the provisioning bridge)."""
        return self._leaf.leaf if self._leaf else None

    @property
    def server_bridge(self) -> str:
        """The bridge the server's NIC is on: the cable to the leaf, or the provisioning bridge itself."""
        return self._leaf.cable_bridge if self._leaf else self.bridge

    @property
    def switch_port(self) -> str | None:
        """``<leaf>/swp1``: the leaf port the server is cabled to (None without a leaf)."""
        return self._leaf.switch_port if self._leaf else None

    @property
    def hca_guid(self) -> str:
        """The server's (fake, well-formed) InfiniBand HCA port GUID."""
        return hca_guid(self.tag)

    def node_env(self, state_dir: Path) -> dict[str, str]:
        """A node-agent serving this server: the redfish driver, media served on the bridge, the server's address,
        its disks as the slots' NVMe (slot i: disk i), a sim topology and burn-in (the server has no GPUs); with a
        leaf, the leaf port the server is cabled to and its HCA's GUID."""
        return {"TESSERA_NODE_DRIVER": "redfish", "TESSERA_NODE_DISCOVERY": "sim", "TESSERA_BURN_IN": "sim",
                "TESSERA_NODE_DATAPLANE": "none", "TESSERA_REDFISH_STATE_DIR": str(state_dir),
                "TESSERA_REDFISH_MEDIA_LISTEN": f"{self.host_address}:0",
                "TESSERA_REDFISH_SERVER_ADDRESS": self.server_address,
                "TESSERA_WIPE_DEVICES": json.dumps({str(i): [d] for i, d in enumerate(self.loops)}),
                **({"TESSERA_REDFISH_SWITCH_PORT": self.switch_port, "TESSERA_REDFISH_HCA_GUIDS": self.hca_guid}
                   if self._leaf else {})}

    def network_env(self) -> dict[str, str]:
        """The network service's settings for the kernel leaf driver programming this lab's leaf (empty without
        one)."""
        return self._leaf.network_env() if self._leaf else {}

    def bmc_body(self, password: str | None = None) -> dict:
        """PUT /v1/nodes/{id}/bmc for this server's BMC (its password unless another is given)."""
        return {"url": self.emulator.url, "system_id": self.server_system_id, "username": USERNAME,
                "password": self.password if password is None else password, "verify_tls": False}

    def bmc_config(self, password: str | None = None) -> BmcConfig:
        return BmcConfig(self.emulator.url, self.server_system_id, USERNAME,
                         self.password if password is None else password, verify_tls=False)

    def start(self) -> BmcLab:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"tessera-bmlab-{self.tag}-"))
        self.workdir.chmod(0o755)
        self._undo.append(lambda: shutil.rmtree(self.workdir, ignore_errors=True))
        self.subnet = free_subnet()
        self._undo.append(lambda: remove_bridge(self.bridge))
        make_bridge(self.bridge, f"{self.host_address}/24")
        if self._leaf:
            self._undo.append(self._leaf.destroy)
            self._leaf.build(self.bridge)
        if not self.with_server:
            return
        for i in range(self.disks):
            device = make_loop_disk(self.workdir / f"nvme{i}.img", self.disk_mib)
            self.loops.append(device)
            self._undo.append(lambda d=device: remove_loop_disk(d))
        (self.workdir / "pool").mkdir()
        self._undo.append(lambda: remove_pool(self.pool))
        make_pool(self.pool, self.workdir / "pool")
        self._undo.append(lambda: remove_server(self.server_name))
        define_server(server_xml(self.server_name, self.server_uuid, self.server_mac, self.server_bridge,
                                 self.console_log, self.loops, self.shell_socket))
        self.emulator = SushyEmulator(self.workdir, [self.server_uuid, self.server_name], self.pool, self.password)
        self._undo.append(self.emulator.stop)
        self.emulator.start()

    def stop(self) -> None:
        """Remove everything made, newest first; every step runs even when an earlier one fails (the first
        failure is raised at the end)."""
        failure = None
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as exc:   # noqa: BLE001 - keep tearing down, report the first
                failure = failure or exc
        if failure is not None:
            raise failure

    def __enter__(self) -> BmcLab:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    def running(self) -> bool:
        return domain_state(self.server_name)[0]

    def cdrom_sources(self) -> list[str]:
        """The files of the server's CD-ROMs in its persistent XML (empty: no media inserted)."""
        import xml.etree.ElementTree as ET
        tree = ET.fromstring(domain_state(self.server_name)[1])
        return [src.get("file") for disk in tree.findall("./devices/disk[@device='cdrom']")
                for src in disk.findall("source") if src.get("file")]

    def console(self) -> str:
        try:
            return self.console_log.read_text(errors="replace")
        except OSError:
            return ""
