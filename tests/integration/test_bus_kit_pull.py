"""A consumer's open pull request (shared.pull) across a restart of the NATS server: the server forgets open
requests, and the consumer asks again as soon as its connection is back, not when the lost request would have
expired. On a NATS server of the test's own (the session's is shared with every other test)."""
from __future__ import annotations

import asyncio
import uuid

import nats
from nats.js.api import StreamConfig

from tests.integration.test_bus_kit import PROBE, Ping
from tests.support.bus import make_envelope, probe_runtime, publish_envelope
from tests.support.polling import eventually
from tooling.embedded import EmbeddedNats

EXPIRES_S = 60.0   # far beyond the test's waits: only the renewal on reconnect can explain a prompt delivery


async def test_after_the_server_restarts_a_consumer_asks_again_at_once(tmp_path, provision):
    server = await asyncio.to_thread(EmbeddedNats(tmp_path / "nats").start)
    handled: list[int] = []
    rt = None
    try:
        options = server.connect_options("admin")
        nc = await nats.connect(server.url, **options)
        await nc.jetstream().add_stream(StreamConfig(name="TESSERA_PROBE", subjects=["probe.>"]))
        await nc.close()
        rt = probe_runtime(PROBE, server.url, await provision("probe"), nkey_file=str(server.identities.add("admin")),
                           pull_expires_s=EXPIRES_S, fetch_wait_s=1.0)

        async def on_ping(ctx, ping: Ping) -> None:
            handled.append(ping.n)

        rt.consumers.subscribe("probe.ping", on_ping, durable="probe_pull_restart")
        await rt.start()
        base = uuid.uuid4().int % 10**6 * 10

        async def ping(n: int) -> None:
            client = await nats.connect(server.url, **options)
            try:
                await publish_envelope(client.jetstream(), "probe.cmd.ping", make_envelope("probe.ping", {"n": n}))
            finally:
                await client.close()

        await ping(base)
        await eventually(lambda: base in handled, timeout=10, what="the ping before the restart")

        await asyncio.to_thread(server.stop, True)          # kill -9: its open pull requests die with it
        await asyncio.to_thread(server.start)               # same port, same stored streams and durables
        await ping(base + 1)
        await eventually(lambda: base + 1 in handled, timeout=EXPIRES_S / 4,
                         what="the ping after the restart, long before the lost request's expiry")
    finally:
        if rt is not None:
            await rt.stop()
        await asyncio.to_thread(server.stop)
