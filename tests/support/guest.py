"""Talking to a booted guest of the project's image (tooling/guest_image): its console log and the root
shell its init keeps on the second serial port (ttyS1, a UNIX socket on the host)."""
from __future__ import annotations

import asyncio
import re
import secrets
import shlex
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .polling import eventually, eventually_blocking

_LINE_MAX = 1000        # busybox ash's line editor keeps 1024 characters of a line


class GuestShell:
    """A root shell inside the guest, reached through the QEMU serial socket bound to its ttyS1.

    One command at a time (a lock serialises callers); ``run`` blocks, ``arun`` runs it off the event loop.
    The guest's shell is interactive: it echoes what it is sent and prints prompts and terminal queries,
    so every command is framed by markers the echo cannot contain. Use as a context manager, or ``close()``.
    """

    def __init__(self, socket_path: Path | str, *, connect_timeout: float = 30.0):
        self.socket_path = Path(socket_path)
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._answering = False   # the shell answered a probe: what is typed now is read

    def __enter__(self) -> GuestShell:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def run(self, command: str, timeout: float = 30) -> tuple[int, str]:
        """Run one shell command line in the guest (stdin from /dev/null) and return (exit status, its
        stdout and stderr with ``\\n`` line ends). Raises ValueError for a command with control characters
        (newline, tab: the guest's line editor would act on them) or too long, and TimeoutError when the command has not
        finished within ``timeout`` seconds (the output seen so far is in the message)."""
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in command):
            raise ValueError(f"a guest command is one line without control characters: {command!r}")
        token = secrets.token_hex(8)
        # The echoed line holds 'TB-''<token>' and TE-%s, never TB-<token> or TE-<token>: only the output does.
        line = (f"echo 'TB-''{token}'; eval {shlex.quote(command)} </dev/null 2>&1; "
                f"printf '\\nTE-%s %d\\n' {token} $?\n")
        if len(line) > _LINE_MAX:
            raise ValueError(f"a guest command line holds at most {_LINE_MAX} characters (busybox's line editor)")
        with self._lock:
            if not self._answering:
                self._wait_answering(time.monotonic() + max(timeout, self.connect_timeout, 60.0))
            return self._run(line, token, command, timeout, time.monotonic() + timeout)

    def _wait_answering(self, deadline: float) -> None:
        """Probe until the shell answers: it starts after the guest's ready line, and what is typed before it reads
        the serial port may be lost (a probe cut short times out; the next one clears the line first)."""
        while True:
            token = secrets.token_hex(8)
            probe = f"echo 'TB-''{token}'; printf '\\nTE-%s %d\\n' {token} 0\n"
            try:
                self._run(probe, token, "a probe", 5, min(deadline, time.monotonic() + 5))
                self._answering = True
                return
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise

    def _run(self, line: str, token: str, command: str, timeout: float, deadline: float) -> tuple[int, str]:
        end = re.compile(rf"\nTE-{token} (\d+)\n")
        sock = self._connect(deadline)
        sock.sendall(b"\x15" + line.encode())        # ^U first: drop whatever a previous client left typed
        seen = ""
        raw = b""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"guest command {command!r} did not finish in {timeout}s; seen: {seen[-2000:]!r}")
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                self.close()
                raise ConnectionError(f"the guest's serial socket closed during {command!r}; seen: {seen[-2000:]!r}")
            raw += chunk
            seen = raw.decode(errors="replace").replace("\r\n", "\n").replace("\r", "")
            begin = seen.find(f"TB-{token}\n")
            if begin < 0:
                continue
            start = begin + len(f"TB-{token}\n")
            m = end.search(seen, start - 1)
            if m:
                return int(m.group(1)), seen[start:m.start()]

    async def arun(self, command: str, timeout: float = 30) -> tuple[int, str]:
        """``run`` in a worker thread."""
        return await asyncio.to_thread(self.run, command, timeout)

    def _connect(self, deadline: float) -> socket.socket:
        """The connected socket; QEMU creates it when the domain starts, so wait for it (bounded)."""
        if self._sock is not None:
            return self._sock
        timeout = max(0.0, min(deadline - time.monotonic(), self.connect_timeout))

        def connected() -> socket.socket | None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.socket_path))
                return sock
            except OSError:
                sock.close()
                return None
        try:
            self._sock = eventually_blocking(connected, timeout=timeout, what=f"the guest shell at {self.socket_path}")
        except AssertionError as exc:
            raise TimeoutError(f"cannot connect to the guest shell at {self.socket_path}: {exc}") from None
        return self._sock


def find_console_line(log_path: Path | str, marker: str) -> str | None:
    """The first line of the console log holding ``marker``, from the marker on (the console may prefix
    it), or None."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except FileNotFoundError:
        return None
    for line in text.replace("\r", "").splitlines():
        at = line.find(marker)
        if at >= 0:
            return line[at:]
    return None


def console_tail(log_path: Path | str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(log_path).read_text(errors="replace").replace("\r", "").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({log_path} does not exist)"


def wait_for_console_line(log_path: Path | str, marker: str, timeout: float, *, fail_on: str | None = None) -> str:
    """Poll the console log until a line holds ``marker`` and return it from the marker on. Raises
    AssertionError with the last 20 console lines after ``timeout`` seconds, or at once when a line holds
    ``fail_on`` (say the guest's FAILED marker while waiting for READY). For synchronous tests: it polls with
    ``eventually`` on a worker thread's loop, like ``await_console_line``."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, await_console_line(log_path, marker, timeout, fail_on=fail_on)).result()


async def await_console_line(log_path: Path | str, marker: str, timeout: float, *, fail_on: str | None = None) -> str:
    """``wait_for_console_line`` for async tests (polls with ``eventually``)."""
    def probe() -> str | None:
        failed = find_console_line(log_path, fail_on) if fail_on else None
        if failed is not None:
            raise AssertionError(f"the guest reported {failed!r} while {marker!r} was awaited; console:\n"
                                 f"{console_tail(log_path)}")
        return find_console_line(log_path, marker)

    try:
        return await eventually(probe, timeout=timeout, interval=0.1, what=f"a console line with {marker!r}")
    except AssertionError as exc:
        if "was awaited" in str(exc):
            raise
        raise AssertionError(f"{exc}; last console lines:\n{console_tail(log_path)}") from None


def http_get(ip: str) -> str:
    """A guest command fetching / from ip:80 (busybox nc: the static busybox's wget cannot resolve without NSS)."""
    return f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} 80"


def init_functions(*names: str) -> str:
    """The shell functions ``names`` as the guest image's init defines them (to run them alone under sh)."""
    from tooling.guest_image import build
    lines = build.INIT.read_text().splitlines()
    out = []
    for name in names:
        start = next(i for i, line in enumerate(lines) if line.startswith(f"{name}() {{"))
        end = start if lines[start].rstrip().endswith("}") else next(i for i in range(start, len(lines)) if lines[i] == "}")
        out += lines[start:end + 1]
    return "\n".join(out) + "\n"
