"""Build the project's guest image from Debian packages, cached by a hash of what goes into it.

The image boots by direct kernel boot: the Debian cloud kernel (``linux-image-cloud-amd64``'s exact ABI
package, fetched with ``apt-get download`` and unpacked with ``dpkg -x``, never installed), an initramfs of
the host's static busybox, the kernel modules a QEMU ``pc`` guest needs, dropbear (SSH) with its shared
libraries, and the ``init`` script next to this module; plus a small qcow2 disk holding an empty ext2 file
system (made by busybox ``mke2fs``, no root needed) that per-instance overlays are based on.

Modules are loaded by ``insmod`` in an order computed here from each module's ``depends=`` modinfo field,
so neither ``depmod`` (kmod is not a build dependency) nor ``modprobe`` is needed in the guest.
"""
from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

BUILDER_VERSION = "3"
NAME = "tessera-guest"
KERNEL_META = "linux-image-cloud-amd64"
SSH_PACKAGES = ("dropbear-bin", "libtomcrypt1", "libtommath1")       # downloaded with the kernel
HOST_PACKAGES = ("busybox-static", "libc6", "libcrypt1", "zlib1g", "libgmp10")  # installed on the build host
# What the guest needs; their dependencies are added (virtiofs brings fuse). No AHCI and no 9p in the cloud kernel:
# IDE CD-ROM, virtiofs (tenant volumes: the init mounts the seed's virtiofs tags at /mnt/<name>). The image's cache
# key hashes the init script, so a change to it builds a new image.
ROOT_MODULES = ("virtio_pci", "virtio_net", "virtio_blk", "virtio_scsi", "ata_piix", "sr_mod", "isofs", "virtiofs")
KERNEL_ARGS = "console=ttyS0 quiet"
DISK_MIB = 64
INIT = Path(__file__).with_name("init")
BUSYBOX = Path("/bin/busybox")

Log = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """The guest image could not be built; the message says which step failed and why."""


@dataclass(frozen=True)
class GuestImage:
    """A built image, as ``image.json`` describes it (paths absolute)."""
    name: str
    os: str
    format: str
    disk: Path
    kernel: Path
    initrd: Path
    kernel_args: str
    sha256: str
    kernel_sha256: str
    initrd_sha256: str
    min_disk_gb: int
    built_from: dict[str, str] = field(default_factory=dict, hash=False)

    def to_json(self) -> dict:
        return {**asdict(self), "disk": str(self.disk), "kernel": str(self.kernel), "initrd": str(self.initrd)}

    @classmethod
    def from_json(cls, data: dict) -> GuestImage:
        return cls(**{**data, "disk": Path(data["disk"]), "kernel": Path(data["kernel"]), "initrd": Path(data["initrd"])})


def default_cache_dir() -> Path:
    """``$TESSERA_IMAGE_CACHE``, else ``$XDG_CACHE_HOME/tessera/images``, else ``~/.cache/tessera/images``."""
    if os.environ.get("TESSERA_IMAGE_CACHE"):
        return Path(os.environ["TESSERA_IMAGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tessera" / "images"


def ensure_image(cache_dir: Path | None = None, *, log: Log = print) -> GuestImage:
    """The guest image for the current inputs, built when the cache has none.

    Cheap when cached (one ``apt-cache`` and one ``dpkg-query`` call to learn the inputs' versions). Safe
    to call concurrently, also from several processes: a build happens in a temporary directory renamed
    into place, under a per-image lock, so nobody sees half an image. Downloaded .debs are kept in
    ``<cache_dir>/debs``. Blocks (seconds cold); raises ImageBuildError.
    """
    cache = Path(cache_dir or default_cache_dir()).resolve()
    cache.mkdir(parents=True, exist_ok=True)
    packages = _resolve_packages()
    digest = _content_hash(packages)
    final = cache / f"{NAME}-{digest}"
    with _locked(cache / f".{NAME}-{digest}.lock"):
        if (final / "image.json").exists():
            return GuestImage.from_json(json.loads((final / "image.json").read_text()))
        started = time.monotonic()
        log(f"building {final.name} (kernel {packages['kernel'][0]} {packages['kernel'][1]})")
        work = Path(tempfile.mkdtemp(prefix=f".build-{digest}-", dir=cache))
        work.chmod(0o755)                 # mkdtemp's 0700 would hide the image from an unprivileged QEMU
        try:
            image = _build(cache, work, final, packages, log)
            shutil.rmtree(work / "scratch")
            os.rename(work, final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        log(f"built {final} in {time.monotonic() - started:.1f}s")
        return image


# --- inputs -------------------------------------------------------------------------------------------

def _resolve_packages() -> dict[str, tuple[str, str]]:
    """{role: (package, version)}: the kernel's exact ABI package and the SSH packages (the apt candidates),
    the busybox and libraries installed on this host."""
    if not BUSYBOX.exists():
        raise ImageBuildError(f"{BUSYBOX} is missing: install busybox-static")
    fields = _apt_show(KERNEL_META, *SSH_PACKAGES)
    depends = fields[KERNEL_META].get("Depends", "")
    m = re.search(r"(linux-image-[0-9][^\s,(]*)\s*\(=\s*([^)\s]+)\)", depends)
    if not m:
        raise ImageBuildError(f"cannot tell the kernel ABI package from {KERNEL_META}'s Depends: {depends!r}")
    out = {"kernel": (m.group(1), m.group(2))}
    out.update({pkg: (pkg, fields[pkg]["Version"]) for pkg in SSH_PACKAGES})
    host = _run(["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Status}\n", *HOST_PACKAGES],
                "dpkg-query of the host's packages", check=False).split("\n")
    installed = {p: v for p, v, status in (line.split() for line in host if line.count(" ") == 2) if status == "installed"}
    missing = [p for p in HOST_PACKAGES if p not in installed]
    if missing:
        raise ImageBuildError(f"host packages the image copies from are not installed: {', '.join(missing)}")
    out.update({p: (p, installed[p]) for p in HOST_PACKAGES})
    return out


def _apt_show(*packages: str, updated: bool = False) -> dict[str, dict[str, str]]:
    """The candidates' fields; on a machine whose package lists are missing or stale (a fresh one, where ./taskw
    installed nothing so never ran apt-get update) the lists are updated once, as root, and asked again."""
    try:
        return _apt_fields(packages)
    except ImageBuildError:
        if updated or os.geteuid() != 0:
            raise
        _run(["apt-get", "update", "-q"], "apt-get update (the package lists)")
        return _apt_show(*packages, updated=True)


def _apt_fields(packages: tuple[str, ...]) -> dict[str, dict[str, str]]:
    text = _run(["apt-cache", "show", "--no-all-versions", *packages], f"apt-cache show {' '.join(packages)} "
                "(is the package list there? apt-get update)")
    found: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if "Package" in fields:
            found.setdefault(fields["Package"], fields)
    absent = [p for p in packages if p not in found]
    if absent:
        raise ImageBuildError(f"apt-cache knows no {', '.join(absent)} (apt-get update?)")
    return found


def _content_hash(packages: dict[str, tuple[str, str]]) -> str:
    inputs = {"builder": BUILDER_VERSION, "packages": sorted(packages.values()), "modules": ROOT_MODULES,
              "kernel_args": KERNEL_ARGS, "disk_mib": DISK_MIB,
              "init": hashlib.sha256(INIT.read_bytes()).hexdigest()}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


# --- the build ----------------------------------------------------------------------------------------

def _build(cache: Path, work: Path, final: Path, packages: dict[str, tuple[str, str]], log: Log) -> GuestImage:
    scratch = work / "scratch"
    root = scratch / "initramfs"
    kernel_pkg, kernel_version = packages["kernel"]
    abi = kernel_pkg.removeprefix("linux-image-")
    kdir = scratch / "kernel"
    _unpack(_fetch_deb(cache, kernel_pkg, kernel_version, log), kdir)
    vmlinuz = kdir / "boot" / f"vmlinuz-{abi}"
    if not vmlinuz.exists():
        raise ImageBuildError(f"{kernel_pkg} has no boot/vmlinuz-{abi}")
    _make_rootfs(root)
    _add_modules(kdir, abi, root)
    ssh = scratch / "ssh"
    for pkg in SSH_PACKAGES:
        _unpack(_fetch_deb(cache, pkg, packages[pkg][1], log), ssh)
    _add_dropbear(ssh, root)
    shutil.copy2(vmlinuz, work / "vmlinuz")
    _pack_initramfs(root, work / "initrd.img")
    _make_disk(scratch, work / "disk.qcow2")
    image = GuestImage(
        name=NAME, os=f"busybox-linux-{abi}", format="qcow2",
        disk=final / "disk.qcow2", kernel=final / "vmlinuz", initrd=final / "initrd.img", kernel_args=KERNEL_ARGS,
        sha256=_sha256(work / "disk.qcow2"), kernel_sha256=_sha256(work / "vmlinuz"),
        initrd_sha256=_sha256(work / "initrd.img"), min_disk_gb=1,
        built_from={pkg: version for pkg, version in sorted(packages.values())})
    (work / "image.json").write_text(json.dumps(image.to_json(), indent=2) + "\n")
    return image


def _fetch_deb(cache: Path, package: str, version: str, log: Log) -> Path:
    """The .deb of ``package`` at ``version``, from ``<cache>/debs`` or downloaded there."""
    debs = cache / "debs"
    debs.mkdir(exist_ok=True)
    deb = debs / f"{package}_{version.replace(':', '%3a')}_amd64.deb"
    if deb.exists():
        return deb
    log(f"downloading {package}={version}")
    with tempfile.TemporaryDirectory(dir=debs) as tmp:
        _run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", f"{package}={version}"],
             f"apt-get download {package}={version} (no network to the Debian mirror?)", cwd=tmp)
        got = list(Path(tmp).glob("*.deb"))
        if len(got) != 1:
            raise ImageBuildError(f"apt-get download {package}={version} left {len(got)} .deb files")
        os.replace(got[0], deb)
    return deb


def _unpack(deb: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    _run(["dpkg", "-x", str(deb), str(into)], f"dpkg -x {deb.name}")


def _make_rootfs(root: Path) -> None:
    for d in ("bin", "dev", "etc", "lib/modules", "lib64", "proc", "sys", "tmp", "root", "run", "mnt", "var/log", "www"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    applets = _run([str(BUSYBOX), "--list"], "busybox --list").split()
    for applet in applets:
        if applet != "busybox" and "/" not in applet:    # a busybox -> busybox link loops (ELOOP): the guest panics
            (root / "bin" / applet).symlink_to("busybox")
    shutil.copy2(INIT, root / "init")
    (root / "init").chmod(0o755)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    (root / "etc" / "shells").write_text("/bin/sh\n")


def _add_modules(kdir: Path, abi: str, root: Path) -> None:
    """Copy ROOT_MODULES and their dependencies, uncompressed, and write their load order."""
    tree = next((p for p in (kdir / "lib/modules" / abi, kdir / "usr/lib/modules" / abi) if p.exists()), None)
    if tree is None:
        raise ImageBuildError(f"the kernel package has no lib/modules/{abi}")
    files = {}
    for path in tree.rglob("*.ko*"):
        files[path.name.split(".ko")[0].replace("-", "_")] = path
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in order:
            return
        if name not in files:
            raise ImageBuildError(f"kernel module {name} (needed by {' <- '.join(chain) or 'the image'}) is not in {abi}")
        data = _module_bytes(files[name])
        m = re.search(rb"depends=([^\0]*)\0", data)
        for dep in filter(None, (m.group(1).decode().split(",") if m else [])):
            visit(dep.replace("-", "_"), (name, *chain))
        (root / "lib/modules" / f"{name}.ko").write_bytes(data)
        order.append(name)

    for name in ROOT_MODULES:
        visit(name, ())
    (root / "lib/modules/load-order").write_text("\n".join(order) + "\n")


def _module_bytes(path: Path) -> bytes:
    """A module's ELF bytes (busybox insmod reads no compressed modules)."""
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".gz"):
        return gzip.decompress(data)
    if path.name.endswith(".zst"):
        return subprocess.run(["zstd", "-dc", str(path)], capture_output=True, check=True).stdout
    return data


def _add_dropbear(ssh: Path, root: Path) -> None:
    """dropbear and every shared library it loads (the downloaded ones first, then the host's)."""
    binary = ssh / "usr/sbin/dropbear"
    if not binary.exists():
        raise ImageBuildError("dropbear-bin has no usr/sbin/dropbear")
    shutil.copy2(binary, root / "bin" / "dropbear")
    libdirs = [ssh / "usr/lib/x86_64-linux-gnu", ssh / "lib/x86_64-linux-gnu"]
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(str(d) for d in libdirs)}
    out = _run(["ldd", str(binary)], "ldd dropbear", env=env)
    (root / "lib/x86_64-linux-gnu").mkdir(parents=True, exist_ok=True)
    for line in out.splitlines():
        parts = line.split()
        if "not found" in line:
            raise ImageBuildError(f"dropbear needs a library this host lacks: {line.strip()}")
        if "=>" in parts:                              # libfoo.so.1 => /path/libfoo.so.1 (0x...)
            src, dest = Path(parts[2]), root / "lib/x86_64-linux-gnu" / parts[0]
        elif parts and parts[0].startswith("/"):       # the dynamic loader, at the path the binary names
            src, dest = Path(parts[0]), root / parts[0].lstrip("/")
        else:
            continue                                   # linux-vdso.so.1: the kernel's
        shutil.copyfile(src, dest)                     # follows the library's symlink: a plain file in the image
        dest.chmod(0o755)


def _pack_initramfs(root: Path, out: Path) -> None:
    """A gzip-compressed newc cpio archive of ``root``, every file owned by root."""
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    try:
        proc = subprocess.run(["cpio", "-o", "-H", "newc", "-R", "0:0", "--quiet"], cwd=root, capture_output=True,
                              input=("\n".join([".", *names]) + "\n").encode())
    except FileNotFoundError as exc:
        raise ImageBuildError("cpio is not installed (apt-get install cpio)") from exc
    if proc.returncode != 0:
        raise ImageBuildError(f"cpio failed: {proc.stderr.decode(errors='replace').strip()}")
    with gzip.open(out, "wb", compresslevel=6) as gz:
        gz.write(proc.stdout)


def _make_disk(scratch: Path, out: Path) -> None:
    raw = scratch / "disk.raw"
    with open(raw, "wb") as f:
        f.truncate(DISK_MIB << 20)
    _run([str(BUSYBOX), "mke2fs", "-F", "-L", "tessera", str(raw)], "busybox mke2fs of the image's disk")
    _run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(out)], "qemu-img convert of the image's disk")


# --- helpers ------------------------------------------------------------------------------------------

def _run(cmd: list[str], what: str, *, check: bool = True, **kw) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{what}: {cmd[0]} is not installed") from exc
    if check and proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ImageBuildError(f"{what} failed (exit {proc.returncode}): {tail}")
    return proc.stdout


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _locked:
    """An exclusive flock on ``path`` for the ``with`` block (held by one process at a time)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
