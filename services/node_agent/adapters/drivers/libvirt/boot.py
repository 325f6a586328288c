"""Waiting for a VM slice's guest to say it is ready: its serial console log is read as it grows, until the
guest's ready line (``TESSERA-READY``, or cloud-init's final message) or its failed line (``TESSERA-FAILED``)."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ....domain.vm import cloudinit
from ..base import DriverError

CONSOLE_TAIL_LINES = 20


def console_tail(files: Path, lines: int = CONSOLE_TAIL_LINES) -> str:
    """The last lines of the instance's console log (``files``: its directory)."""
    try:
        text = (files / "console.log").read_bytes()[-16384:].decode(errors="replace")
    except OSError:
        return "(no console output)"
    return "\n".join(text.splitlines()[-lines:]) or "(no console output)"


async def wait_ready(files: Path, timeout_s: float, active: Callable[[], Awaitable[bool]]) -> None:
    """Until the console has the guest's ready line (recorded in ``instance.json`` as the boot time); raises
    DriverError when the guest says it failed, the domain stops (``active`` says False), or ``timeout_s`` passes —
    with the console's last lines."""
    info_path = files / "instance.json"
    info = json.loads(info_path.read_text())
    if info.get("ready_at"):
        return
    deadline = time.monotonic() + timeout_s
    seen = 0
    while True:
        try:
            with open(files / "console.log", "rb") as f:
                f.seek(seen)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        complete = chunk[:chunk.rfind(b"\n") + 1]
        seen += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            failed = cloudinit.parse_failed_line(line)
            if failed is not None:
                raise DriverError(f"the guest failed to configure itself: {failed}")
            if cloudinit.parse_ready_line(line) is not None:   # ours, or cloud-init's final message
                info["ready_at"] = time.time()
                info_path.write_text(json.dumps(info))
                return
        if time.monotonic() > deadline:
            raise DriverError(f"the guest did not report ready within {timeout_s:g} s; "
                              f"console:\n{console_tail(files)}")
        if not await active():
            raise DriverError(f"the domain stopped before the guest was ready; console:\n{console_tail(files)}")
        await asyncio.sleep(0.1)
