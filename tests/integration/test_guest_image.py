"""The project's guest image end to end: built from Debian packages and cached by content hash, its NoCloud
seed ISO, the guest init's parsing of the rendered seed (run by the host's busybox), and, as root, one
guest booted under TCG on the real libvirtd: READY on its console, ping, HTTP, SSH and its serial shell.

No NATS or PostgreSQL here: ``clean_streams`` (autouse in tests/integration) is overridden to nothing.
"""
from __future__ import annotations

import hashlib
import io
import os
import random
import re
import secrets
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.node_agent.adapters.drivers.libvirt.seed import write_seed_iso
from services.node_agent.domain.vm.cloudinit import FAILED_MARKER, READY_MARKER, Seed, network_config, parse_ready_line, user_data
from tests.support.guest import GuestShell, init_functions, wait_for_console_line
from tooling.guest_image import GuestImage, ImageBuildError, build, ensure_image
from tooling.libvirt_host import ensure_libvirtd

ODD_COMMENT = 'tessera "test" key\\with #odd: [chars] \'quoted\''
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="bridges and libvirtd need root")


@pytest.fixture(scope="module", autouse=True)
def clean_streams():
    """This module uses no NATS (overrides the integration suite's autouse fixture of that name)."""
    yield


@pytest.fixture(scope="session")
def guest_image() -> GuestImage:
    """The image in the shared cache (``$TESSERA_IMAGE_CACHE`` or ~/.cache): built once per machine."""
    return ensure_image(log=lambda msg: print(msg))


@pytest.fixture(scope="session")
def libvirtd() -> str:
    ensure_libvirtd("qemu:///system")
    return "qemu:///system"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_image_is_cached_by_content_and_rebuilt_when_its_init_changes(tmp_path, guest_image, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "debs").symlink_to(guest_image.kernel.parent.parent / "debs")     # the shared .debs: no download
    first_log: list[str] = []
    with ThreadPoolExecutor(2) as pool:                # two callers at once: one builds, both get the image
        first, twin = pool.map(lambda _: ensure_image(cache, log=first_log.append), range(2))
    assert first == twin
    assert len([m for m in first_log if m.startswith("building")]) == 1
    assert not any("downloading" in m for m in first_log)
    assert first.kernel.parent.name.startswith("tessera-guest-") and first.kernel.parent.parent == cache.resolve()
    assert (first.sha256, first.kernel_sha256, first.initrd_sha256) == (sha256(first.disk), sha256(first.kernel),
                                                                         sha256(first.initrd))
    assert first.format == "qcow2" and first.os.startswith("busybox-linux-") and "console=ttyS0" in first.kernel_args
    assert any(p.startswith("linux-image-") for p in first.built_from) and first.min_disk_gb == 1
    assert not [p for p in cache.iterdir() if p.name.startswith(".build-")]          # no half image left

    again_log: list[str] = []
    assert ensure_image(cache, log=again_log.append) == first
    assert again_log == []                                                              # nothing built

    changed = tmp_path / "init"
    changed.write_bytes(build.INIT.read_bytes() + b"# changed\n")
    monkeypatch.setattr(build, "INIT", changed)
    rebuilt_log: list[str] = []
    rebuilt = ensure_image(cache, log=rebuilt_log.append)
    assert rebuilt.kernel.parent != first.kernel.parent
    assert any(m.startswith("building") for m in rebuilt_log) and not any("downloading" in m for m in rebuilt_log)


def test_a_failed_download_says_what_failed_and_leaves_no_image(tmp_path, monkeypatch):
    resolve = build._resolve_packages

    def unknown_kernel():
        return {**resolve(), "kernel": ("linux-image-0.0.0-0-cloud-amd64", "0.0-0")}

    monkeypatch.setattr(build, "_resolve_packages", unknown_kernel)
    with pytest.raises(ImageBuildError, match=r"apt-get download linux-image-0\.0\.0-0-cloud-amd64=0\.0-0 .* failed"):
        ensure_image(tmp_path, log=lambda msg: None)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("tessera-guest-", ".build-"))]


def test_seed_iso_holds_the_nocloud_documents_under_cidata(tmp_path):
    import pycdlib

    seed = Seed("i-iso", "iso-vm", (f"ssh-ed25519 AAAAkey {ODD_COMMENT}",), "52:54:00:00:00:01", "10.0.0.5", 24, "10.0.0.1")
    path = tmp_path / "seed.iso"
    write_seed_iso(path, seed)
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    try:
        assert iso.pvd.volume_identifier.decode().strip() == "cidata"
        for name, expected in (("user-data", user_data(seed)), ("network-config", network_config(seed))):
            for kind in ("rr_path", "joliet_path"):
                out = io.BytesIO()
                iso.get_file_from_iso_fp(out, **{kind: f"/{name}"})
                assert out.getvalue().decode() == expected
        assert sorted(c.rock_ridge.name().decode() for c in iso.list_children(rr_path="/")
                      if c.rock_ridge and not (c.is_dot() or c.is_dotdot())) == ["meta-data", "network-config", "user-data"]
    finally:
        iso.close()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".seed.iso")]      # no temp file left


def test_the_guest_init_parses_the_rendered_seed(tmp_path):
    key = f"ssh-ed25519 AAAAkey {ODD_COMMENT}"
    seed = Seed("i-parse", "parse-vm", (key, "ssh-rsa AAAAother"), "52:54:00:AB:00:02", "10.1.2.3", 16, "10.1.0.1",
                ("10.1.0.1", "9.9.9.9"), ifname="tnt0")
    (tmp_path / "user-data").write_text(user_data(seed))
    (tmp_path / "network-config").write_text(network_config(seed))
    script = init_functions("unq", "yval", "netcfg", "ssh_keys") + (
        'netcfg network-config; echo "hostname $(yval hostname user-data)"; ssh_keys user-data\n')
    proc = subprocess.run(["busybox", "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "macaddress 52:54:00:ab:00:02", "set-name tnt0", "address 10.1.2.3/16", "via 10.1.0.1",
        "dns 10.1.0.1", "dns 9.9.9.9", "hostname parse-vm", key, "ssh-rsa AAAAother"]


# --- one guest booted on the real libvirtd ------------------------------------------------------------

@dataclass
class Booted:
    seed: Seed
    ready: str
    console: Path
    shell: GuestShell
    ssh_key: Path
    boot_s: float


def domain_xml(name: str, image: GuestImage, overlay: Path, seed_iso: Path, bridge: str, mac: str, tap: str,
               console: Path, shell_sock: Path) -> str:
    return f"""<domain type='qemu'>
  <name>{name}</name><memory unit='MiB'>256</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><kernel>{image.kernel}</kernel><initrd>{image.initrd}</initrd>
    <cmdline>{image.kernel_args}</cmdline></os>
  <on_reboot>destroy</on_reboot>
  <devices>
    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='{overlay}'/>
      <target dev='vda' bus='virtio'/></disk>
    <disk type='file' device='cdrom'><driver name='qemu' type='raw'/><source file='{seed_iso}'/>
      <target dev='hdc' bus='ide'/><readonly/></disk>
    <interface type='bridge'><mac address='{mac}'/><source bridge='{bridge}'/><model type='virtio'/>
      <target dev='{tap}'/></interface>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    <serial type='unix'><source mode='bind' path='{shell_sock}'/><target port='1'/></serial>
  </devices>
</domain>"""


def free_subnet() -> int:
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return next(x for x in random.sample(range(2, 250), 248) if f" 10.254.{x}." not in used)


@pytest.fixture(scope="module")
def booted(tmp_path_factory, guest_image, libvirtd):
    import libvirt

    work = tmp_path_factory.mktemp("guest")
    tag = secrets.token_hex(3)
    bridge, tap, x = f"tgt{tag}", f"tgv{tag}", free_subnet()
    keys = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPkwkc3pKUFf7lcLJsuO6Ogbe0QVUwr7GdtMusmCb17o " + ODD_COMMENT]
    ssh_key = work / "id_ed25519"   # ssh-keygen and ssh: openssh-client, in system-packages.txt
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tessera-test", "-f", str(ssh_key)], check=True)
    keys.append(ssh_key.with_suffix(".pub").read_text().strip())
    seed = Seed(f"i-{tag}", f"guest-{tag}", tuple(keys), f"52:54:00:{tag[0:2]}:{tag[2:4]}:{tag[4:6]}",
                f"10.254.{x}.10", 24, f"10.254.{x}.1", (f"10.254.{x}.1",), ifname="tnt0")
    write_seed_iso(work / "seed.iso", seed)
    overlay, console, sock = work / "overlay.qcow2", work / "console.log", work / "shell.sock"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(guest_image.disk), "-F", "qcow2", str(overlay)],
                   check=True, timeout=60)
    conn = libvirt.open(libvirtd)
    dom = None
    shell = GuestShell(sock)
    try:
        subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"10.254.{x}.1/24", "dev", bridge], check=True)
        subprocess.run(["ip", "link", "set", bridge, "up"], check=True)
        started = time.monotonic()
        dom = conn.createXML(domain_xml(f"tessera-test-{tag}", guest_image, overlay, work / "seed.iso", bridge,
                                        seed.mac, tap, console, sock), 0)
        ready = wait_for_console_line(console, READY_MARKER, timeout=45, fail_on=FAILED_MARKER)
        boot_s = time.monotonic() - started
        print(f"guest READY {boot_s:.1f}s after createXML: {ready}")
        yield Booted(seed, ready, console, shell, ssh_key, boot_s)
    finally:
        shell.close()
        if dom is not None:
            try:
                dom.destroy()
            except libvirt.libvirtError:
                pass                             # already gone
        conn.close()
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        overlay.unlink(missing_ok=True)


@pytest.mark.root
@needs_root
def test_the_guest_reports_ready_with_its_seed(booted):
    assert parse_ready_line(booted.ready) == {"instance": booted.seed.instance_id, "hostname": booted.seed.hostname,
                                              "ip": f"{booted.seed.ip_address}/24", "mac": booted.seed.mac}
    assert booted.console.read_text(errors="replace").count(READY_MARKER) == 1
    assert booted.boot_s < 45


@pytest.mark.root
@needs_root
def test_the_guest_answers_ping_and_http(booted):
    ip = booted.seed.ip_address
    subprocess.run(["ping", "-c", "1", "-W", "5", ip], check=True, capture_output=True, timeout=30)
    with urllib.request.urlopen(f"http://{ip}/", timeout=20) as resp:
        page = resp.read().decode()
    assert booted.seed.hostname in page and booted.seed.instance_id in page and ip in page


@pytest.mark.root
@needs_root
def test_the_serial_shell_runs_commands_inside_the_guest(booted):
    shell = booted.shell
    assert shell.run("hostname") == (0, booted.seed.hostname + "\n")
    status, keys = shell.run("cat /root/.ssh/authorized_keys")
    assert status == 0 and keys.splitlines() == list(booted.seed.ssh_keys)
    assert shell.run("stat -c %a /root/.ssh/authorized_keys") == (0, "600\n")
    assert shell.run("cat /sys/class/net/tnt0/address") == (0, booted.seed.mac + "\n")
    assert shell.run("ip route show default")[1].startswith(f"default via 10.254.{booted.seed.ip_address.split('.')[2]}.1")
    assert shell.run("sh -c 'echo TE-fake 9; exit 3'") == (3, "TE-fake 9\n")
    assert shell.run("printf no-newline") == (0, "no-newline")
    assert shell.run("true") == (0, "")
    assert shell.run("echo " + "x" * 800)[1] == "x" * 800 + "\n"
    assert re.search(r"/dev/vda on /mnt/vda type ext[234]", shell.run("mount")[1])


@pytest.mark.root
@needs_root
def test_ssh_logs_in_with_the_seeded_key(booted):
    proc = subprocess.run(["ssh", "-i", str(booted.ssh_key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR",
                           f"root@{booted.seed.ip_address}", "hostname; id -u"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [booted.seed.hostname, "0"]
