"""A consumer's lag on /metrics (tessera_consumer_pending_messages): what the stream still held for the durable
at its last fetch, as the fetched message's metadata says, plus what waits in the consumer's window; the window's
alone once a poll found nothing."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from shared.consumer import Consumers
from shared.observability import CONSUMER_PENDING


class FakePull:
    """An open pull request over ``held`` messages; a wait that finds none times out as shared.pull's does."""

    def __init__(self, held: int):
        self.held = held

    async def next_batch(self, batch: int, timeout: float):
        if self.held == 0:
            raise TimeoutError
        n = min(batch, self.held)
        self.held -= n
        return [SimpleNamespace(metadata=SimpleNamespace(num_pending=self.held + n - 1 - i)) for i in range(n)]


def _lag(consumer: str) -> float:
    return CONSUMER_PENDING.labels("lagging", consumer)._value.get()


async def test_the_lag_is_what_the_stream_holds_after_each_fetch_and_zero_after_an_empty_poll():
    consumers = SimpleNamespace(service="lagging", settings=SimpleNamespace(fetch_wait_s=0.01))
    sub = SimpleNamespace(name="lagging-durable", pull=FakePull(held=25), window=[])
    assert len(await Consumers._fetch(consumers, sub, 10)) == 10
    assert _lag("lagging-durable") == 15 + 10      # the stream's 15, and the 10 fetched about to wait
    sub.window = ["waiting"] * 4                   # 4 of them still wait for a worker at the next fetch
    await Consumers._fetch(consumers, sub, 10)
    assert _lag("lagging-durable") == 5 + 4 + 10
    await Consumers._fetch(consumers, sub, 10)
    assert sub.pull.held == 0 and _lag("lagging-durable") == 0 + 4 + 5
    with pytest.raises(TimeoutError):
        await Consumers._fetch(consumers, sub, 10)
    assert _lag("lagging-durable") == 4             # nothing more came: the window's still wait
    sub.window = []
    with pytest.raises(TimeoutError):
        await Consumers._fetch(consumers, sub, 10)
    assert _lag("lagging-durable") == 0
