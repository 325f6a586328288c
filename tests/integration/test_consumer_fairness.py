"""A consumer serves the tenants whose messages wait fairly (shared.fairness through shared.consumer), on a real
nats-server and PostgreSQL: a trickle of one tenant's messages is not queued behind another tenant's burst, a
tenant's weight sets its share while both wait, and a message waiting its turn in the window is not redelivered.

The probe service (tests/support/batchprobe.py: its own contract and stream) handles one message at a time here
(one worker, batches of one), so the order its handler runs in is the order of service.
"""
from __future__ import annotations

import asyncio
import uuid

import pytest

from shared.envelope import Envelope
from shared.unit_of_work import UnitOfWork
from tests.support import batchprobe
from tests.support.bus import make_envelope, probe_runtime, publish_envelope
from tests.support.polling import eventually

A, B = uuid.uuid4(), uuid.uuid4()
BURST = 60   # within the window of this consumer (64 messages): what the server holds beyond it is fetched in order


@pytest.fixture
async def stream(infra, provision, nc):
    await batchprobe.fresh_stream(nc.jetstream())
    return await provision(batchprobe.SERVICE)


class Recorder:
    """The probe's handler: records (tenant, n) in the order served, taking ``pause`` s over each."""

    def __init__(self, pause: float):
        self.pause, self.served = pause, []

    async def __call__(self, ctx: UnitOfWork, ping: batchprobe.Ping) -> None:
        await asyncio.sleep(self.pause)   # the handler's own work, which lets the burst build up a queue
        self.served.append((ctx.causation.tenant_id, ping.n))

    def position(self, tenant: uuid.UUID, n: int) -> int:
        return self.served.index((tenant, n))


def start_probe(infra, dsn: str, recorder: Recorder, **bus):
    rt = probe_runtime(batchprobe.CONTRACT, infra.nats_url, dsn, nkey_file=infra.nkey_file("admin"),
                       max_workers=1, batch_size=1, **bus)
    rt.consumers.subscribe(batchprobe.PING, recorder)
    return rt


async def ping(js, tenant: uuid.UUID, n: int, weight: int | None = None) -> Envelope:
    env = make_envelope(batchprobe.PING, {"n": n}, tenant_id=tenant)
    if weight is not None:
        env = env.model_copy(update={"weight": weight})
    await publish_envelope(js, "batchprobe.cmd.ping", env)
    return env


async def test_a_trickle_is_served_between_a_burst_of_another_tenants_messages(infra, stream, nc):
    js, recorder = nc.jetstream(), Recorder(pause=0.01)
    rt = start_probe(infra, stream, recorder)
    await rt.start()
    try:
        for n in range(BURST):
            await ping(js, A, n)
        arrived_after = {}
        for i in range(6):   # one of B's every eight of A's served, while A's burst still waits
            await eventually(lambda i=i: len(recorder.served) >= 8 * (i + 1), timeout=30, interval=0.005)
            arrived_after[i] = len(recorder.served)
            await ping(js, B, i)
        await eventually(lambda: len(recorder.served) == BURST + 6, timeout=60, interval=0.01)
    finally:
        await rt.stop()
    # each of B's is served among the first few served after it was sent (one in flight, one of A's turn),
    # not after the rest of A's burst; A's own are served in the order sent
    late = {i: recorder.position(B, i) - arrived_after[i] for i in range(6)}
    assert all(d <= 3 for d in late.values()), (late, recorder.served)
    assert [n for t, n in recorder.served if t == A] == list(range(BURST))
    assert recorder.position(B, 5) < recorder.position(A, 55)


async def test_a_tenants_weight_sets_its_share_while_both_wait(infra, stream, nc):
    js, recorder = nc.jetstream(), Recorder(pause=0.0)
    for n in range(40):   # both queues wait before the consumer starts: the window holds them all at once
        await ping(js, A, n, weight=3)
        await ping(js, B, n)
    rt = start_probe(infra, stream, recorder)
    await rt.start()
    try:
        await eventually(lambda: len(recorder.served) == 80, timeout=60, interval=0.01)
    finally:
        await rt.stop()
    first = [t for t, _ in recorder.served[:40]]
    assert first.count(A) == 30 and first.count(B) == 10, recorder.served[:40]   # three of A's for one of B's
    assert [n for t, n in recorder.served if t == B] == list(range(40))


async def test_a_message_waiting_its_turn_longer_than_ack_wait_is_not_redelivered(infra, stream, nc):
    js, recorder = nc.jetstream(), Recorder(pause=0.05)
    rt = start_probe(infra, stream, recorder, ack_wait_s=1.5)
    await rt.start()
    try:
        for n in range(60):   # 3 s of work: most wait in the window for longer than ack_wait
            await ping(js, A if n % 2 else B, n)
        await eventually(lambda: len(recorder.served) == 60, timeout=60, interval=0.01)
        info = await eventually(lambda: js.consumer_info(batchprobe.STREAM, batchprobe.CONSUMER), timeout=10,
                                interval=0.02, until=lambda i: i.num_ack_pending == 0, what="the last ack")
    finally:
        await rt.stop()
    assert info.num_redelivered == 0
    assert sorted(n for _, n in recorder.served) == list(range(60))


async def test_what_waits_in_the_window_at_a_stop_is_delivered_again_at_once(infra, stream, nc):
    js, first = nc.jetstream(), Recorder(pause=0.05)
    rt = start_probe(infra, stream, first, ack_wait_s=60)   # a redelivery by expiry would come a minute later
    await rt.start()
    try:
        for n in range(30):
            await ping(js, A, n)
        await eventually(lambda: len(first.served) >= 5, timeout=30, interval=0.005)
    finally:
        await rt.stop()
    second = Recorder(pause=0.0)
    rt = start_probe(infra, stream, second, ack_wait_s=60)
    await rt.start()
    try:
        await eventually(lambda: len(first.served) + len(second.served) == 30, timeout=20, interval=0.01,
                         what="the rest of the burst, handled by the next consumer")
    finally:
        await rt.stop()
    assert sorted(n for _, n in first.served + second.served) == list(range(30))   # each once
