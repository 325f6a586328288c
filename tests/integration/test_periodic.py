"""The kit's periodic work against the real PostgreSQL: with two replicas, a leader-only step runs on one at a
time and the other takes over when the leader stops or its session dies; a per-replica step runs on both."""
from __future__ import annotations

import asyncio

import pytest

from shared.contract import ServiceContract
from tests.support.bus import probe_runtime
from tests.support.polling import eventually

PERIODIC = ServiceContract(service="periodic", title="periodic", description="test-only service",
                           messages=[], receives=[])
PERIOD_S = 0.02


@pytest.fixture
async def replicas(infra, provision):
    """start() -> a started replica of the test-only service ``periodic``, with ``.led`` (runs of its
    leader-only step) and ``.own`` (runs of its per-replica step); all stopped after the test."""
    dsn, started = await provision("periodic"), []

    async def start():
        rt = probe_runtime(PERIODIC, infra.nats_url, dsn, nkey_file=infra.nkey_file("admin"))
        rt.led, rt.own = [], []

        async def led():
            rt.led.append(asyncio.get_running_loop().time())

        async def own():
            rt.own.append(1)
        rt.every(PERIOD_S, led, leader="periodic", at_once=True)
        rt.every(PERIOD_S, own, at_once=True)
        await rt.start()
        started.append(rt)
        return rt

    yield start
    for rt in started:
        await rt.stop()


async def runs_more(rt, n: int = 5) -> None:
    """Wait until ``rt``'s leader-only step has run ``n`` more times."""
    before = len(rt.led)
    await eventually(lambda: len(rt.led) >= before + n, timeout=10, what=f"{n} more runs of the leader's step")


async def test_a_leader_only_step_runs_on_one_replica_and_the_other_takes_over_when_it_stops(replicas):
    first = await replicas()
    await eventually(lambda: first.led, timeout=10, what="the first replica to lead")
    second = await replicas()
    await eventually(lambda: second.own, timeout=10, what="the second replica's own step")
    await runs_more(first)
    assert not second.led
    assert second.leaderships["periodic"].lease is not None and not second.leaderships["periodic"].leading.is_set()

    await first.stop()                     # a clean stop releases the lock at once
    stopped = len(first.led)
    await eventually(lambda: second.led, timeout=10, what="the standby to take over")
    await runs_more(second)
    assert len(first.led) == stopped


async def test_a_standby_takes_over_when_the_leaders_session_dies(replicas):
    first = await replicas()
    await eventually(lambda: first.led, timeout=10, what="the first replica to lead")
    second = await replicas()
    first.leaderships["periodic"].lease.terminate_for_test()     # as a crashed process's session would end
    await eventually(lambda: second.led, timeout=10, what="the standby to take over")
    await eventually(lambda: not first.leaderships["periodic"].leading.is_set(), timeout=10, what="the old leader to notice")
    idle, own = len(first.led), len(first.own)
    await runs_more(second)
    assert len(first.led) == idle                  # it stands by
    await eventually(lambda: len(first.own) > own, timeout=10, what="the old leader's own step")   # which goes on
