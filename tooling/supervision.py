"""The runner's `restart: unless-stopped`: a service or node-agent process that exits while nobody asked it
to is started again, after a delay that doubles with each quick failure (0.5 s, 1 s, 2 s … up to 30 s) and
starts over once a process has stayed up for a while. Each exit is one JSON line, on stderr (where `./taskw up`
shows it) and in ``logs/runner.log`` of the platform's work folder.

What "nobody asked" means is the process's ``supervised`` flag: the platform sets it once the process is ready,
and clears it when it stops the process on purpose (``Platform.stop``, ``Platform.kill`` without ``restart``,
a ``Platform.restart`` in progress); a start of any kind ends a wait for a restart (``ServiceProcess.start``).
Every process is polled a few times a second by one task; a crash loop costs one process start per delay,
never a busy loop.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from .embedded import REPO

READY = re.compile(r"TESSERA_READY service=(\S+) instance=(\S+) port=(\d+)")
log = logging.getLogger("tessera.runner")

RESTART_SETTING = "TESSERA_RUNNER_RESTART"   # unless-stopped (the default) or no


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the runner restarts what exits, from TESSERA_RUNNER_RESTART (``unless-stopped``, the default, or
    ``no``, as compose spells them); any other value is refused with a ValueError naming the variable."""
    value = (os.environ if environ is None else environ).get(RESTART_SETTING, "").strip() or "unless-stopped"
    if value not in ("unless-stopped", "no"):
        raise ValueError(f"{RESTART_SETTING}={value!r}: expected unless-stopped or no")
    return value == "unless-stopped"


@dataclass(frozen=True)
class RestartPolicy:
    """``initial_s`` doubles after each exit of a process that had been up less than ``stable_s``, up to
    ``cap_s``; a process that stayed up ``stable_s`` or longer starts over at ``initial_s``. ``poll_s``: how
    often the processes are looked at (so also how late at most an exit is noticed)."""

    initial_s: float = 0.5
    cap_s: float = 30.0
    stable_s: float = 10.0
    poll_s: float = 0.1

    def delay(self, quick_failures: int) -> float:
        """The wait before the next start, after ``quick_failures`` exits in a row (1-based) of a process that
        never stayed up ``stable_s``."""
        return min(self.cap_s, self.initial_s * 2 ** max(0, quick_failures - 1))


def exit_reason(returncode: int) -> dict[str, object]:
    """``{"exit_code": n}`` for an exit, ``{"signal": "SIGKILL"}`` for a death by signal (Popen's negative code)."""
    if returncode < 0:
        try:
            return {"signal": signal.Signals(-returncode).name}
        except ValueError:
            return {"signal": str(-returncode)}
    return {"exit_code": returncode}


@dataclass
class ServiceProcess:
    """One service's (or node-agent's) process. ``supervised``: started again when it exits (``Supervisor``);
    the platform sets it once the process is ready and clears it whenever it stops the process on purpose.
    ``argv``: the command, when not the service's module (a test's stand-in)."""

    name: str
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    port: int | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    argv: list[str] | None = None
    supervised: bool = False
    restart_at: float | None = None   # monotonic time of the supervisor's next start, while it waits
    restarts: int = 0                 # starts by the supervisor so far
    quick_failures: int = 0           # exits in a row, each before it had stayed up long (the backoff's exponent)
    started_at: float = 0.0           # monotonic

    @property
    def module(self) -> str:
        return "services." + (self.name.split(":")[0])

    def start(self) -> None:
        """Start the process (again); a restart the supervisor was waiting to make is then made."""
        self.ready.clear()
        self.port, self.restart_at = None, None
        log = open(self.log_path, "ab")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.argv or [sys.executable, "-m", self.module], env=self.env, cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        threading.Thread(target=self._pump, args=(self.proc, log), daemon=True).start()

    def respawn(self, env: dict[str, str] | None = None) -> None:
        """Start again with the same settings (``env`` changes some); the gateway on the port it had, so that
        clients keep their URL."""
        if self.name == "gateway" and self.port:
            self.env["TESSERA_HTTP_PORT"] = str(self.port)
        self.env.update(env or {})
        self.start()

    def _pump(self, proc: subprocess.Popen, log) -> None:
        try:
            for raw in proc.stdout:
                log.write(raw)
                log.flush()
                m = READY.search(raw.decode(errors="replace"))
                if m:
                    self.port = int(m.group(3))
                    self.ready.set()
        finally:
            log.close()

    async def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.is_set():
            if self.proc is None or self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name} exited before it was ready:\n{tail}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready after {timeout}s (log: {self.log_path})")
            await asyncio.sleep(0.05)

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


class Supervisor:
    """Watches the processes ``procs()`` returns (read again at every look: processes come and go) and
    starts again each supervised one that has exited. ``run`` until cancelled."""

    def __init__(self, procs: Callable[[], Mapping[str, ServiceProcess]], policy: RestartPolicy | None = None,
                 log_path: Path | None = None):
        self.procs = procs
        self.policy = policy or RestartPolicy()
        self.log_path = log_path

    async def run(self) -> None:
        while True:
            try:
                self.look(time.monotonic())
            except Exception:   # a failed look (a start that cannot fork) must not end supervision
                log.exception("runner: supervising the processes failed; trying again")
            await asyncio.sleep(self.policy.poll_s)

    def look(self, now: float) -> None:
        """One pass: note each newly exited supervised process (and when to start it), start those whose delay
        has passed."""
        for name, p in list(self.procs().items()):
            if not p.supervised or p.proc is None:
                continue
            if p.restart_at is not None:
                if now >= p.restart_at:
                    p.respawn()
                    self._record("info", "process.restarted", name, pid=p.proc.pid, restarts=p.restarts)
                continue
            code = p.proc.poll()
            if code is None:
                continue
            p.quick_failures = 1 if now - p.started_at >= self.policy.stable_s else p.quick_failures + 1
            p.restarts += 1
            delay = self.policy.delay(p.quick_failures)
            p.restart_at = now + delay
            self._record("warning", "process.exited", name, pid=p.proc.pid, **exit_reason(code),
                         restarts=p.restarts, quick_failures=p.quick_failures, next_delay_s=delay,
                         log=str(p.log_path))

    def _record(self, level: str, event: str, name: str, **fields) -> None:
        line = json.dumps({"ts": datetime.now(UTC).isoformat(timespec="milliseconds"), "level": level,
                           "logger": "tessera.runner", "event": event, "process": name, **fields})
        log.log(logging.WARNING if level == "warning" else logging.INFO, line)
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(line + "\n")
