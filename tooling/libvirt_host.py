"""A usable local libvirtd for the test suite and ``./taskw up``, started the way the suite starts its own
nats-server and PostgreSQL: by itself, when none answers.

libvirt must run QEMU as root here: ``/dev/kvm`` is root-only and KVM does not work, and with QEMU running
as ``libvirt-qemu`` libvirtd re-probes QEMU on every capabilities lookup and every ``defineXML`` (8-18 s
each). So ``qemu.conf`` gets ``user = "root"`` and ``group = "root"`` before libvirtd starts (or libvirtd
is restarted when it was running without them). Domains then show as "tainted: high-privileges".
"""
from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

QEMU_CONF = Path("/etc/libvirt/qemu.conf")
QEMU_BINARY = Path("/usr/bin/qemu-system-x86_64")
LIBVIRTD_PID = Path("/run/libvirtd.pid")
_DAEMONS = ("libvirtd", "virtlogd")
_SETTING = re.compile(r'^\s*(user|group)\s*=\s*"([^"]*)"\s*$')


class LibvirtUnavailable(RuntimeError):
    """No usable libvirtd can be had on this machine; the message says why."""


def libvirt_usable() -> tuple[bool, str]:
    """(True, "") when this process could start and use a local libvirtd with QEMU, else (False, why).
    Cheap: looks at files only."""
    if os.geteuid() != 0:
        return False, "not root (starting libvirtd and running QEMU as root need root)"
    missing = [name for name in (*_DAEMONS, "virsh") if _which(name) is None]
    if missing:
        return False, f"not installed: {', '.join(missing)} (apt-get install libvirt-daemon-system libvirt-clients)"
    if not QEMU_BINARY.exists():
        return False, f"{QEMU_BINARY} is missing (apt-get install qemu-system-x86)"
    return True, ""


def ensure_libvirtd(uri: str = "qemu:///system", *, timeout_s: float = 60) -> None:
    """Make sure a libvirtd answers on ``uri`` with QEMU running as root.

    Idempotent, and cheap when all is fine (one ``virsh version`` and a read of qemu.conf). Otherwise it
    settles qemu.conf, creates the ``kvm`` group and ``libvirt-qemu`` user when missing, starts virtlogd and
    libvirtd (restarting libvirtd when it ran with an unsettled qemu.conf), and waits up to ``timeout_s``
    for ``virsh capabilities`` to answer. Blocks; raises LibvirtUnavailable.
    """
    answering = _virsh(uri, "version", timeout_s=10)
    if answering and (_conf_settled() or os.geteuid() != 0):
        return                                   # not root: usable as it is, and nothing here may change it
    ok, why = libvirt_usable()
    if not ok:
        raise LibvirtUnavailable(f"libvirtd does not answer on {uri} and cannot be started: {why}")
    changed = _settle_conf()
    _ensure_accounts()
    if not _running("virtlogd"):
        _start("virtlogd")
    if changed and _running("libvirtd"):
        _stop_libvirtd(timeout_s)
    if not _running("libvirtd"):
        _start("libvirtd")
    deadline = time.monotonic() + timeout_s
    while not _virsh(uri, "capabilities", timeout_s=max(1.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            raise LibvirtUnavailable(f"libvirtd was started but `virsh -c {uri} capabilities` did not answer "
                                     f"within {timeout_s}s")
        time.sleep(0.2)


def _conf_settled() -> bool:
    try:
        text = QEMU_CONF.read_text()
    except OSError:
        return False
    found = dict(m.groups() for m in map(_SETTING.match, text.splitlines()) if m)
    return found.get("user") == "root" and found.get("group") == "root"


def _settle_conf() -> bool:
    """Write ``user``/``group = "root"`` into qemu.conf (other settings of them commented out); True when
    the file changed."""
    if _conf_settled():
        return False
    try:
        lines = QEMU_CONF.read_text().splitlines() if QEMU_CONF.exists() else []
        kept = [f"# {line}  # replaced by tessera (tooling/libvirt_host.py)" if _SETTING.match(line) else line for line in lines]
        kept += ["# tessera: QEMU runs as root (/dev/kvm is root-only; see tooling/libvirt_host.py)",
                 'user = "root"', 'group = "root"']
        QEMU_CONF.parent.mkdir(parents=True, exist_ok=True)
        tmp = QEMU_CONF.with_name(QEMU_CONF.name + ".tessera-tmp")
        tmp.write_text("\n".join(kept) + "\n")
        os.replace(tmp, QEMU_CONF)
    except OSError as exc:
        raise LibvirtUnavailable(f"cannot settle {QEMU_CONF}: {exc}") from exc
    return True


def _ensure_accounts() -> None:
    """The ``kvm`` group and ``libvirt-qemu`` user that libvirt's QEMU driver looks up at start."""
    try:
        grp.getgrnam("kvm")
    except KeyError:
        _cmd(["groupadd", "--system", "kvm"], "groupadd kvm")
    try:
        pwd.getpwnam("libvirt-qemu")
    except KeyError:
        _cmd(["useradd", "--system", "--gid", "kvm", "--home-dir", "/var/lib/libvirt", "--no-create-home",
              "--shell", "/usr/sbin/nologin", "libvirt-qemu"], "useradd libvirt-qemu")


def _running(name: str) -> bool:
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == name:
                return True
        except OSError:
            continue                             # the process exited meanwhile
    return False


def _start(name: str) -> None:
    _cmd([_which(name) or name, "-d"], f"{name} -d")


def _stop_libvirtd(timeout_s: float) -> None:
    """Stop the libvirtd named by its pid file (running domains keep running: QEMU is not its child)."""
    try:
        pid = int(LIBVIRTD_PID.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError) as exc:
        raise LibvirtUnavailable(f"qemu.conf changed but libvirtd cannot be restarted: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() >= deadline:
            raise LibvirtUnavailable(f"libvirtd (pid {pid}) did not stop within {timeout_s}s to take the new qemu.conf")
        time.sleep(0.1)


def _virsh(uri: str, what: str, *, timeout_s: float) -> bool:
    virsh = _which("virsh")
    if virsh is None:
        return False
    try:
        return subprocess.run([virsh, "-c", uri, what], capture_output=True, timeout=timeout_s).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _cmd(argv: list[str], what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LibvirtUnavailable(f"{what}: {exc}") from exc
    if proc.returncode != 0:
        raise LibvirtUnavailable(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
