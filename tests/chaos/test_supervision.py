"""The runner's supervisor on stand-in processes (a second each, no platform): what exits unasked is started
again with a doubling delay that starts over after a stable run, each exit is one JSON line, and what was
stopped on purpose stays down."""
from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

import pytest

from tests.support.polling import eventually
from tooling.supervision import RestartPolicy, ServiceProcess, Supervisor, exit_reason, wanted

# ready, then serves until signalled (signal.pause: no timer of its own)
SERVES = "print('TESSERA_READY service=stand-in instance=0 port=1', flush=True); import signal; signal.pause()"
CRASHES = "import sys; sys.exit(3)"


def stand_in(tmp_path, code: str, name: str = "stand-in") -> ServiceProcess:
    p = ServiceProcess(name, {}, tmp_path / f"{name}.log", argv=[sys.executable, "-c", code])
    p.start()
    p.supervised = True
    return p


def records(tmp_path) -> list[dict]:
    path = tmp_path / "runner.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def procs():
    started: dict[str, ServiceProcess] = {}
    yield started
    for p in started.values():
        p.supervised = False
        p.signal(signal.SIGKILL)
        p.wait_exit(5)


async def test_a_killed_process_is_started_again_and_the_runner_says_why(tmp_path, procs):
    procs["svc"] = p = stand_in(tmp_path, SERVES, "svc")
    await p.wait_ready(10)
    first = p.proc.pid
    task = asyncio.create_task(Supervisor(lambda: procs, RestartPolicy(initial_s=0.05, poll_s=0.02),
                                          tmp_path / "runner.log").run())
    try:
        p.signal(signal.SIGKILL)
        await eventually(lambda: p.ready.is_set() and p.proc.pid != first, timeout=10, what="a new process, ready")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    exited, restarted = records(tmp_path)
    assert {k: exited[k] for k in ("level", "event", "process", "pid", "signal", "restarts", "next_delay_s")} == {
        "level": "warning", "event": "process.exited", "process": "svc", "pid": first, "signal": "SIGKILL",
        "restarts": 1, "next_delay_s": 0.05}
    assert (restarted["event"], restarted["pid"]) == ("process.restarted", p.proc.pid)


async def test_a_crash_loop_waits_twice_as_long_each_time_up_to_the_cap(tmp_path, procs):
    procs["loop"] = p = stand_in(tmp_path, CRASHES, "loop")
    p.wait_exit(10)
    supervisor = Supervisor(lambda: procs, RestartPolicy(initial_s=1, cap_s=4, stable_s=60), tmp_path / "runner.log")
    now = time.monotonic()
    for _ in range(5):   # each pass: the exit is seen, then the process starts once its delay has passed
        supervisor.look(now)
        now = p.restart_at
        supervisor.look(now)
        p.wait_exit(10)
    exits = [r for r in records(tmp_path) if r["event"] == "process.exited"]
    assert [r["next_delay_s"] for r in exits] == [1, 2, 4, 4, 4]
    assert [r["exit_code"] for r in exits] == [3] * 5 and [r["restarts"] for r in exits] == [1, 2, 3, 4, 5]
    # nothing starts before its time: a look in between only waits
    supervisor.look(now)
    waiting_until = p.restart_at
    supervisor.look(waiting_until - 0.01)
    assert p.restart_at == waiting_until and p.proc.poll() is not None


async def test_a_process_that_stayed_up_starts_over_at_the_first_delay(tmp_path, procs):
    procs["svc"] = p = stand_in(tmp_path, CRASHES, "svc")
    p.wait_exit(10)
    policy = RestartPolicy(initial_s=1, cap_s=30, stable_s=10)
    p.quick_failures = 4   # it had been failing: 8 s would come next
    Supervisor(lambda: procs, policy, tmp_path / "runner.log").look(p.started_at + policy.stable_s)
    assert records(tmp_path)[-1]["next_delay_s"] == 1 and p.quick_failures == 1


async def test_a_process_stopped_on_purpose_stays_down(tmp_path, procs):
    procs["svc"] = p = stand_in(tmp_path, SERVES, "svc")
    await p.wait_ready(10)
    p.supervised = False   # what Platform.kill (without restart) and stop() do first
    p.signal(signal.SIGTERM)
    p.wait_exit(10)
    Supervisor(lambda: procs, RestartPolicy(), tmp_path / "runner.log").look(time.monotonic() + 60)
    assert p.restart_at is None and p.proc.poll() is not None and records(tmp_path) == []


def test_the_setting_turns_it_off_and_refuses_a_typo():
    assert wanted({}) and wanted({"TESSERA_RUNNER_RESTART": "unless-stopped"})
    assert not wanted({"TESSERA_RUNNER_RESTART": "no"})
    with pytest.raises(ValueError, match="TESSERA_RUNNER_RESTART"):
        wanted({"TESSERA_RUNNER_RESTART": "always"})
    assert exit_reason(-9) == {"signal": "SIGKILL"} and exit_reason(1) == {"exit_code": 1}
