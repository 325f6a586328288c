"""shared.pull's bookkeeping of its one open pull request, against a fake connection that records requests
and delivers what the test says (the real server: tests/integration/test_bus_kit.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from shared.pull import PullRefused, StandingPull


class FakeConnection:
    def __init__(self):
        self.requests: list[dict] = []
        self.cb = None

    def new_inbox(self) -> str:
        return "_INBOX_test.1"

    async def subscribe(self, subject: str, cb):
        self.cb = cb
        return SimpleNamespace(unsubscribe=self._unsubscribe)

    async def _unsubscribe(self) -> None:
        self.cb = None

    async def publish(self, subject: str, data: bytes, reply: str) -> None:
        assert subject == "$JS.API.CONSUMER.MSG.NEXT.S.d" and reply == "_INBOX_test.1"
        self.requests.append(json.loads(data))

    async def deliver(self, *, data: bytes = b"m", status: str | None = None) -> None:
        headers = {"Status": status, "Description": "Consumer Deleted"} if status else None
        await self.cb(SimpleNamespace(data=b"" if status else data, headers=headers))


async def _pull(nc: FakeConnection, **kw) -> StandingPull:
    return await StandingPull(nc, "S", "d", **kw).start()


async def test_one_request_serves_messages_until_its_batch_is_used_up():
    nc = FakeConnection()
    pull = await _pull(nc, expires_s=5)
    with pytest.raises(TimeoutError):
        await pull.next_batch(3, timeout=0.01)
    assert nc.requests == [{"batch": 3, "expires": 5_000_000_000}]
    await nc.deliver(data=b"1")
    await nc.deliver(data=b"2")
    assert [m.data for m in await pull.next_batch(3, timeout=1)] == [b"1", b"2"]
    await nc.deliver(data=b"3")
    assert [m.data for m in await pull.next_batch(1, timeout=1)] == [b"3"]
    assert len(nc.requests) == 1          # the three came on the first request
    with pytest.raises(TimeoutError):
        await pull.next_batch(2, timeout=0.01)
    assert nc.requests[-1]["batch"] == 2  # used up: the next asks for the room it is given now


async def test_an_expired_request_is_renewed_and_a_lost_one_replaced():
    nc = FakeConnection()
    pull = await _pull(nc, expires_s=0.05, margin_s=0.05)
    with pytest.raises(TimeoutError):
        await pull.next_batch(4, timeout=0.01)
    await nc.deliver(status="408")        # expired
    with pytest.raises(TimeoutError):
        await pull.next_batch(4, timeout=0.01)
    assert len(nc.requests) == 2
    with pytest.raises(TimeoutError):     # no word from the server past expiry and margin: taken for lost
        await pull.next_batch(4, timeout=0.3)
    assert len(nc.requests) >= 3


async def test_a_refused_request_is_raised_once_after_what_came_before_it():
    nc = FakeConnection()
    pull = await _pull(nc, expires_s=5)
    with pytest.raises(TimeoutError):
        await pull.next_batch(4, timeout=0.01)
    await nc.deliver(data=b"1")
    await nc.deliver(status="409")
    assert [m.data for m in await pull.next_batch(4, timeout=1)] == [b"1"]
    with pytest.raises(PullRefused, match="Consumer Deleted"):
        await pull.next_batch(4, timeout=1)
    with pytest.raises(TimeoutError):     # asked again, with a new request
        await pull.next_batch(4, timeout=0.01)
    assert len(nc.requests) == 2


async def test_a_heartbeat_does_not_end_the_request_and_stop_unsubscribes():
    nc = FakeConnection()
    pull = await _pull(nc, expires_s=5)
    with pytest.raises(TimeoutError):
        await pull.next_batch(4, timeout=0.01)
    await nc.deliver(status="100")
    with pytest.raises(TimeoutError):
        await pull.next_batch(4, timeout=0.01)
    assert len(nc.requests) == 1
    await pull.stop()
    assert nc.cb is None


async def test_a_renewal_after_a_reconnect_sends_another_request_at_once():
    nc = FakeConnection()
    pull = await _pull(nc, expires_s=30)
    with pytest.raises(TimeoutError):
        await pull.next_batch(4, timeout=0.01)
    pull.renew()                          # the connection came back: the open request may be gone
    with pytest.raises(TimeoutError):
        await pull.next_batch(4, timeout=0.01)
    assert len(nc.requests) == 2
