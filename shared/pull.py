"""A durable pull consumer's messages as they arrive, through one pull request kept open on the server.

nats-py's ``fetch(1)`` costs a lone message three messages of protocol besides its acknowledgement: a ``no_wait``
request, the server's "no messages" answer, then the long poll that finally delivers it; and again for the next.
Here a consumer keeps one request open for as many messages as its window has room for (``expires`` after
``expires_s``): the server delivers each message as it is published, and a new request goes out only when the
open one is used up or has expired. A message then costs its delivery and its acknowledgement, and an idle
consumer one request per ``expires_s``.

The request never asks for more than the room it was given, so what it delivers always fits the window it was
asked for. The server forgets a request whose reply subject lost its subscriber (``stop``), so nothing is
delivered to a consumer that stopped. After a reconnect the request may be gone without a word (the server
restarted): ``renew`` sends another at once; one lost otherwise is given up after ``expires_s`` and a margin.
"""
from __future__ import annotations

import asyncio
import collections
import json
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

_STATUS = "Status"
_MARGIN_S = 1.0    # past a request's expiry, how long to wait for its end before taking it for lost


class PullRefused(Exception):
    """The server ended the open request with a refusal (409): the consumer was deleted, its leader changed …"""


class StandingPull:
    """Messages of the durable ``durable`` of ``stream``, read on an inbox of the connection's own prefix."""

    def __init__(self, nc: Client, stream: str, durable: str, *, expires_s: float, margin_s: float = _MARGIN_S):
        self._nc, self._expires_s, self._margin_s = nc, expires_s, margin_s
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._arrived: collections.deque[Msg] = collections.deque()
        self._signal = asyncio.Event()
        self._refused: str | None = None   # why the server refused the last request (409), until raised
        self._owed = 0                  # messages the open request may still deliver (0: none open)
        self._lost_at = 0.0             # when the open request is taken for lost

    async def start(self) -> StandingPull:
        self._sub = await self._nc.subscribe(self._inbox, cb=self._on_message)
        return self

    async def stop(self) -> None:
        """Unsubscribe: the server drops the open request (its reply subject has no subscriber)."""
        if self._sub is not None:
            sub, self._sub, self._owed = self._sub, None, 0
            await sub.unsubscribe()

    def renew(self) -> None:
        """Take the open request for lost (the connection was re-established: the server may have forgotten it),
        so that the next wait sends another at once."""
        self._owed = 0
        self._signal.set()

    async def _on_message(self, msg: Msg) -> None:
        self._arrived.append(msg)
        self._signal.set()

    async def next_batch(self, room: int, timeout: float) -> list[Msg]:
        """The first message to arrive (waiting at most ``timeout``: TimeoutError when none did) and every other
        one already arrived; never more than the ``room`` of the request they answer."""
        assert self._sub is not None, "not started"
        deadline = time.monotonic() + timeout
        got: list[Msg] = []
        while True:
            while self._arrived:
                self._take(self._arrived.popleft(), got)
            self._signal.clear()
            if got:
                return got
            if self._refused:     # the consumer deleted, a leadership change, …: the caller waits and asks again
                refused, self._refused = self._refused, None
                raise PullRefused(refused)
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError
            if self._owed == 0 or now >= self._lost_at:    # none open, or the open one taken for lost
                if room <= 0:
                    raise TimeoutError
                await self._request(room)
            try:
                async with asyncio.timeout(min(deadline, self._lost_at) - time.monotonic()):
                    await self._signal.wait()
            except TimeoutError:
                pass

    async def _request(self, room: int) -> None:
        body = {"batch": room, "expires": int(self._expires_s * 1_000_000_000)}
        await self._nc.publish(self._next_subject, json.dumps(body).encode(), reply=self._inbox)
        self._owed, self._lost_at = room, time.monotonic() + self._expires_s + self._margin_s

    def _take(self, msg: Msg, into: list[Msg]) -> None:
        status = msg.headers.get(_STATUS) if msg.headers and not msg.data else None
        if status is not None:
            if status in ("408", "409"):   # the request ended: it expired, or was refused (its description says)
                self._owed = 0
                if status == "409":
                    self._refused = msg.headers.get("Description") or "409"
            return
        self._owed = max(self._owed - 1, 0)
        into.append(msg)
