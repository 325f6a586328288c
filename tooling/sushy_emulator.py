"""sushy-emulator, the Redfish BMC of the bare-metal lab (``tooling.bmc_lab``): the real emulator with its libvirt
driver, on 127.0.0.1, in front of the lab's servers, with HTTP basic auth.

sushy-emulator keeps (memoizes) its libvirt connection: whenever libvirtd restarts, restart the emulator too
(``SushyEmulator.restart()``), or every Redfish call fails with a dead connection.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import requests

URI = "qemu:///system"
USERNAME = "admin"
EMULATOR = Path(sys.executable).with_name("sushy-emulator")
# Legacy boot needs a loader path: with none, sushy-tools writes <loader type='rom'/> and libvirt 9.0 refuses it
# ("no loader path specified and firmware auto selection disabled"); <os firmware='bios'> finds no firmware
# descriptor for BIOS in Debian's QEMU. SeaBIOS (the same BIOS QEMU loads by default) satisfies both.
SEABIOS = "/usr/share/seabios/bios-256k.bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SushyEmulator:
    """sushy-emulator with the libvirt driver on 127.0.0.1, showing only ``allowed`` domains, basic auth with
    one bcrypt entry (sushy-tools' ``auth_basic`` accepts only bcrypt digests; the service root stays open)."""

    workdir: Path
    allowed: list[str]
    pool: str
    password: str
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = self.port or free_port()
        htpasswd = self.workdir / "htpasswd"
        htpasswd.write_text(f"{USERNAME}:{bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
        config = self.workdir / "emulator.conf"
        config.write_text(
            f"SUSHY_EMULATOR_LIBVIRT_URI = {URI!r}\n"
            f"SUSHY_EMULATOR_ALLOWED_INSTANCES = {self.allowed!r}\n"
            f"SUSHY_EMULATOR_STORAGE_POOL = {self.pool!r}\n"
            f"SUSHY_EMULATOR_BOOT_LOADER_MAP = {{'Legacy': {{'x86_64': {SEABIOS!r}}},\n"
            "                                  'UEFI': {'x86_64': '/usr/share/OVMF/OVMF_CODE_4M.fd'}}\n"
            f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\n")
        log = open(self.workdir / "emulator.log", "ab")
        try:
            self.proc = subprocess.Popen(
                [str(EMULATOR), "--config", str(config), "--libvirt-uri", URI, "--interface", "127.0.0.1",
                 "--port", str(self.port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + 30
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sushy-emulator did not answer on {self.url}: {self.log_tail(5)}")
            time.sleep(0.1)   # a process start: nothing to wait on but the port

    def _answers(self) -> bool:
        try:
            return requests.get(f"{self.url}/redfish/v1/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        """Terminate the emulator (its whole process group), then kill it after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        """After a libvirtd restart: the emulator's cached libvirt connection is dead."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join((self.workdir / "emulator.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no emulator log)"
