"""`./taskw up` as a supervisor or a terminal's job control runs it: a signal sent to the PID it started
(nothing else) stops the whole platform, nats-server, PostgreSQL and every service, and the command exits."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from tooling.embedded import REPO, free_port

START_TIMEOUT_S = 180   # a cold start on a busy machine: initdb, every service, the demo seed
STOP_TIMEOUT_S = 60


class Up:
    """``./taskw up`` on its own data folder and gateway port, in its own session (as a supervisor starts it);
    remembers every process of its tree it has seen, and finds the servers that name its data folder."""

    def __init__(self, data: Path):
        self.data = data
        env = {**os.environ, "TESSERA_DATA_DIR": str(data), "TESSERA_GATEWAY_PORT": str(free_port()),
               "TESSERA_SKIP_SYSTEM_PACKAGES": "1", "PYTHONUNBUFFERED": "1",
               "TESSERA_DEMO_SPOT": "0"}   # the demo's spot pool is two more simulated nodes, nothing a signal meets
        self.proc = subprocess.Popen([str(REPO / "taskw"), "up"], cwd=REPO, env=env, start_new_session=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        self.seen: dict[int, psutil.Process] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def collect(self) -> None:
        """Remember the tree below the PID and every process naming the data folder (nats-server -c …, postgres -D …)."""
        try:
            for p in [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
        except psutil.Error:
            pass
        for p in psutil.process_iter(["cmdline"]):
            if str(self.data) in " ".join(p.info["cmdline"] or []):
                self.seen.setdefault(p.pid, p)

    def wait_for(self, done, timeout: float, what: str) -> None:
        """Read its output (collecting its processes meanwhile) until ``done(line)`` or ``done(None)`` is true."""
        deadline = time.monotonic() + timeout
        while True:
            self.collect()
            if done(None):
                return
            left = deadline - time.monotonic()
            assert left > 0, f"no {what} after {timeout}s; output:\n{''.join(self.output)}"
            try:
                line = self.lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                continue
            assert line is not None, f"it exited ({self.proc.wait()}) before {what}; output:\n{''.join(self.output)}"
            self.output.append(line)
            if done(line):
                self.collect()
                return

    def alive(self) -> list[str]:
        """The remembered processes still running (a zombie has stopped: only its parent's wait is missing)."""
        self.collect()
        left = []
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.pid} {_cmdline(p)[:120]}")
            except psutil.Error:
                pass
        return left

    def kill_all(self) -> None:
        """Leave nothing behind, whatever the test found."""
        for p in self.seen.values():
            try:
                if p.is_running():
                    p.kill()
            except psutil.Error:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _servers(up: Up) -> set[str]:
    """The names of the remembered processes still running."""
    names = set()
    for p in up.seen.values():
        try:
            names.add(p.name())
        except psutil.Error:
            pass
    return names


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:   # gone since (a psql or initdb of the start)
        return ""


def _gone(up: Up) -> list[str]:
    """Wait (bounded) until the remembered processes have all exited; return those still running."""
    deadline = time.monotonic() + 10
    while (left := up.alive()) and time.monotonic() < deadline:
        psutil.wait_procs(list(up.seen.values()), timeout=0.2)
    return left


# SIGTERM takes the same path as SIGINT (the runner handles both alike): the suite sends one, test:long both
@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.long)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_pid_of_taskw_up_stops_the_whole_platform_and_it_exits(tmp_path, sig):
    up = Up(tmp_path / "data")
    try:
        up.wait_for(lambda line: line is not None and "Tessera is up." in line, START_TIMEOUT_S, "'Tessera is up.'")
        up.wait_for(lambda line: line is not None and "Ctrl-C stops everything" in line, 30, "the end of the banner")
        services = [p for p in up.seen.values() if " -m services." in _cmdline(p)]
        assert len(services) >= 8, "every core service and the demo nodes' agents ran"   # 7 core + 2 node-agents
        assert {"nats-server", "postgres"} <= _servers(up)

        os.kill(up.proc.pid, sig)   # the PID only, not its process group
        try:
            code = up.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"./taskw up did not exit {STOP_TIMEOUT_S}s after {sig.name}; output:\n{''.join(up.output)}")
        assert code == 0
        assert _gone(up) == []
    finally:
        up.kill_all()


def test_a_signal_while_taskw_up_is_still_starting_stops_what_it_started(tmp_path):
    up = Up(tmp_path / "data")
    try:
        # PostgreSQL runs (the runner is starting it, or provisioning, or starting services)
        up.wait_for(lambda line: "postgres" in _servers(up), START_TIMEOUT_S, "postgres started")
        assert not any("Tessera is up." in line for line in up.output)
        os.kill(up.proc.pid, signal.SIGINT)
        try:
            code = up.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"./taskw up did not exit {STOP_TIMEOUT_S}s after SIGINT; output:\n{''.join(up.output)}")
        assert code == 128 + signal.SIGINT, "stopped before it was up"
        assert _gone(up) == []
    finally:
        up.kill_all()
