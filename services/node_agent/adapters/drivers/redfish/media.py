"""A bare-metal allocation's boot media and the small HTTP server the BMC and the server talk to.

The boot ISO (``build_iso``) is BIOS-bootable, made by ``grub-mkrescue`` (grub-pc-bin, xorriso, mtools): GRUB
boots the image's kernel and initramfs with the image's kernel arguments at once, and the NoCloud seed
(``meta-data``, ``user-data``, ``network-config``) lies at the ISO's root under the volume id CIDATA, so the
guest's init finds its seed on the very CD it booted from (``/dev/sr0``).

``MediaServer`` (aiohttp, started on first use) serves ``GET /media/<token>.iso`` to the BMC (virtual media
fetches its image by URL) and takes the server's ``POST /phone-home/<token>`` (cloud-init's phone_home form:
instance_id, hostname, and ip). Tokens are random per allocation; an unknown token is a 404.
"""
from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

VOLUME_ID = "CIDATA"
_KERNEL_ARGS = re.compile(r"[A-Za-z0-9_.,:=/@+-]+( [A-Za-z0-9_.,:=/@+-]+)*")   # GRUB reads $ ; " ' \ { } itself
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,86}")
MKRESCUE_TIMEOUT_S = 120


class MediaError(Exception):
    """The boot media could not be made or served; the message says why."""


def new_token() -> str:
    return secrets.token_urlsafe(24)


def grub_cfg(kernel_args: str) -> str:
    """Boot the ISO's kernel and initramfs at once (no menu), with ``kernel_args``; raises MediaError for
    arguments GRUB would read as its own syntax."""
    if not _KERNEL_ARGS.fullmatch(kernel_args):
        raise MediaError(f"kernel arguments {kernel_args!r}: only words of A-Z a-z 0-9 _ . , : = / @ + - "
                         "separated by single spaces")
    return ("set timeout=0\nset default=0\n"
            "menuentry \"tessera\" {\n"
            f"  linux /boot/vmlinuz {kernel_args}\n"
            "  initrd /boot/initrd.img\n"
            "}\n")


def build_iso(path: Path, kernel: Path, initrd: Path, kernel_args: str, seed: dict[str, str]) -> None:
    """Write the boot ISO to ``path`` (atomically). ``seed``: file name → text, placed at the ISO's root.
    Blocking (~0.5 s); raises MediaError (missing kernel or initrd, grub-mkrescue missing or failing)."""
    for what, file in (("kernel", kernel), ("initrd", initrd)):
        if not Path(file).is_file():
            raise MediaError(f"the image's {what} {file} does not exist")
    mkrescue = shutil.which("grub-mkrescue")
    if mkrescue is None:
        raise MediaError("grub-mkrescue is missing (install grub-pc-bin, grub-common, xorriso and mtools)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".iso-", dir=path.parent))
    try:
        root = work / "root"
        (root / "boot" / "grub").mkdir(parents=True)
        (root / "boot" / "grub" / "grub.cfg").write_text(grub_cfg(kernel_args))
        shutil.copyfile(kernel, root / "boot" / "vmlinuz")
        shutil.copyfile(initrd, root / "boot" / "initrd.img")
        for name, text in seed.items():
            (root / name).write_text(text)
        out = work / "boot.iso"
        try:
            proc = subprocess.run([mkrescue, "-o", str(out), str(root), "--", "-volid", VOLUME_ID],
                                  capture_output=True, text=True, timeout=MKRESCUE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise MediaError(f"grub-mkrescue did not finish within {MKRESCUE_TIMEOUT_S} s") from None
        if proc.returncode != 0 or not out.exists():
            raise MediaError(f"grub-mkrescue failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
        os.chmod(out, 0o644)
        os.replace(out, path)
    except OSError as exc:
        raise MediaError(f"cannot write the boot ISO {path}: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class PhoneHome:
    """What a server posted when it was ready."""
    instance_id: str
    hostname: str
    ip: str
    remote: str | None
    at: float


class _Slot:
    def __init__(self, iso: Path):
        self.iso = iso
        self.arrived = asyncio.Event()
        self.report: PhoneHome | None = None


SLOTS = web.AppKey("slots", dict)


class MediaServer:
    """Serves boot ISOs and takes phone-homes, one token per allocation. Not started until ``start()`` (the
    driver calls it on first use); ``close()`` stops it. ``listen`` (host, port): port 0 takes any free port."""

    def __init__(self, listen: tuple[str, int], base_url: str | None = None):
        self.listen = listen
        self._base_url = base_url.rstrip("/") if base_url else None
        self._slots: dict[str, _Slot] = {}
        self._runner: web.AppRunner | None = None
        self._starting = asyncio.Lock()
        self.port: int | None = None

    @property
    def base_url(self) -> str:
        if self._base_url:
            return self._base_url
        if self.port is None:
            raise MediaError("the media server has not started")
        host = self.listen[0]
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024)
        app[SLOTS] = self._slots
        app.router.add_get("/media/{name}", _media)
        app.router.add_post("/phone-home/{token}", _phone_home)
        return app

    async def start(self) -> str:
        """Start serving (idempotent); the base URL the BMC and the server use. Raises MediaError."""
        async with self._starting:
            if self._runner is None:
                runner = web.AppRunner(self.app(), access_log=None)
                await runner.setup()
                try:
                    site = web.TCPSite(runner, self.listen[0], self.listen[1])
                    await site.start()
                except OSError as exc:
                    await runner.cleanup()
                    raise MediaError(f"the media server cannot listen on {self.listen[0]}:{self.listen[1]}: "
                                     f"{exc}") from None
                self.port = runner.addresses[0][1]
                self._runner = runner
        return self.base_url

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def offer(self, token: str, iso: Path) -> tuple[str, str]:
        """Serve ``iso`` under ``token``: (the ISO's URL, the phone-home URL)."""
        if not _TOKEN.fullmatch(token):
            raise MediaError("a media token is 16-86 URL-safe characters")
        self._slots[token] = _Slot(Path(iso))
        return f"{self.base_url}/media/{token}.iso", self.phone_home_url(token)

    def phone_home_url(self, token: str) -> str:
        return f"{self.base_url}/phone-home/{token}"

    def withdraw(self, token: str | None) -> None:
        """Stop serving the token's ISO and delete the file; nothing for an unknown token."""
        slot = self._slots.pop(token, None) if token else None
        if slot is not None:
            slot.iso.unlink(missing_ok=True)

    async def wait_phone_home(self, token: str) -> PhoneHome:
        """Until the server of ``token`` phones home (callers bound the wait); raises MediaError for an unknown token."""
        slot = self._slots.get(token)
        if slot is None:
            raise MediaError("no media is offered under this token")
        await slot.arrived.wait()
        return slot.report


async def _media(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    slot = request.app[SLOTS].get(name.removesuffix(".iso")) if name.endswith(".iso") else None
    if slot is None or not slot.iso.is_file():
        raise web.HTTPNotFound(text="no such media\n")
    return web.FileResponse(slot.iso, headers={"Content-Type": "application/octet-stream",
                                               "Content-Disposition": f'attachment; filename="{name}"'})


async def _phone_home(request: web.Request) -> web.Response:
    slot = request.app[SLOTS].get(request.match_info["token"])
    if slot is None:
        raise web.HTTPNotFound(text="unknown token\n")
    form = await request.post()
    fields = {k: str(form.get(k, ""))[:255] for k in ("instance_id", "hostname", "ip")}
    if not slot.arrived.is_set():
        slot.report = PhoneHome(**fields, remote=request.remote, at=time.time())
        slot.arrived.set()
    return web.Response(text="ok\n")
