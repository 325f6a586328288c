"""The bus's authentication and contract-derived permissions, against the suite's nats-server (run with the
configuration the embedded runner renders from tooling.bus_permissions): no credentials, no connection; an
identity publishes and subscribes only where its contract says. That each service's identity can do its
job is shown by the rest of the suite, which runs every service with its own."""
from __future__ import annotations

import asyncio
import contextlib

import nats
import pytest
from nats.js.api import DeliverPolicy

from shared.streams import declare_streams


class Refusals:
    """What the server refused on one connection: nats-py hands the server's ``-ERR 'Permissions Violation ...'``
    to the error callback only."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self._changed = asyncio.Event()

    async def error_cb(self, exc: Exception) -> None:
        self.errors.append(str(exc))
        self._changed.set()

    async def wait_for(self, *fragments: str, timeout: float = 10.0) -> str:
        """The first error naming every one of ``fragments`` (case-insensitive), waiting for it."""
        async with asyncio.timeout(timeout):
            while True:
                for e in self.errors:
                    if all(f.lower() in e.lower() for f in fragments):
                        return e
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
async def connect(infra):
    """connect(identity) -> (client, refusals): a connection as ``identity`` (closed after the test)."""
    clients = []

    async def _connect(identity: str):
        refusals = Refusals()
        nc = await nats.connect(infra.nats_url, error_cb=refusals.error_cb, **infra.connect_options(identity))
        clients.append(nc)
        return nc, refusals

    yield _connect
    for nc in clients:
        with contextlib.suppress(Exception):
            await nc.close()


async def test_a_connection_without_credentials_is_refused(infra):
    with pytest.raises(nats.errors.Error, match="(?i)authorization violation"):
        await nats.connect(infra.nats_url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5)


async def test_a_seed_the_server_does_not_know_is_refused(infra, tmp_path):
    import nkeys
    import secrets

    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER))
    with pytest.raises(nats.errors.Error, match="(?i)authorization violation"):
        await nats.connect(infra.nats_url, nkeys_seed=str(stranger), allow_reconnect=False, max_reconnect_attempts=0,
                           connect_timeout=5)


async def test_the_network_service_cannot_publish_the_schedulers_event_and_nobody_sees_it(connect, nc):
    network, refusals = await connect("network")
    seen: list[str] = []
    got_own = asyncio.Event()

    async def on_msg(msg) -> None:
        seen.append(msg.subject)
        if msg.subject == "network.evt.network_created":
            got_own.set()

    subs = [await nc.subscribe("scheduler.evt.slots_reserved", cb=on_msg),
            await nc.subscribe("network.evt.network_created", cb=on_msg)]
    await nc.flush()
    js = nc.jetstream()
    before = (await js.stream_info("TESSERA_SCHEDULER")).state.last_seq
    try:
        await network.publish("scheduler.evt.slots_reserved", b'{"forged": true}')
        await network.publish("network.evt.network_created", b'{"marker": true}')   # its own: allowed
        await refusals.wait_for("permissions violation", "publish", "scheduler.evt.slots_reserved")
        # one connection's messages arrive in order: once its next (allowed) message is here, the refused one
        # would have been too
        await asyncio.wait_for(got_own.wait(), 10)
        assert seen == ["network.evt.network_created"]
        assert (await js.stream_info("TESSERA_SCHEDULER")).state.last_seq == before
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await js.purge_stream("TESSERA_NETWORK", subject="network.evt.network_created")


async def test_billing_cannot_subscribe_to_the_sagas_subjects_nor_read_another_identitys_inbox(connect):
    billing, refusals = await connect("billing")
    await billing.subscribe("saga.>")
    await refusals.wait_for("permissions violation", "subscription", '"saga.>"')
    await billing.subscribe("_INBOX_gateway.>")
    await refusals.wait_for("permissions violation", "subscription", '"_INBOX_gateway.>"')
    await billing.subscribe("storage.evt.usage_reported")   # what it receives: allowed
    await billing.flush()
    assert not any("usage_reported" in e for e in refusals.errors)


async def test_a_service_updates_only_its_own_stream_and_consumes_only_what_it_receives(connect):
    scheduler, refusals = await connect("scheduler")
    await scheduler.publish("$JS.API.STREAM.UPDATE.TESSERA_BILLING", b"{}")
    await refusals.wait_for("permissions violation", "$JS.API.STREAM.UPDATE.TESSERA_BILLING")
    await scheduler.publish("$JS.API.STREAM.PURGE.TESSERA_SCHEDULER", b"{}")
    await refusals.wait_for("permissions violation", "$JS.API.STREAM.PURGE.TESSERA_SCHEDULER")
    billing, refusals = await connect("billing")
    # a consumer on a subject billing does not receive, under the name of one of its own durables
    await billing.publish("$JS.API.CONSUMER.CREATE.TESSERA_STORAGE.billing__storage_volume_changed.storage.evt.quota_changed", b"{}")
    await refusals.wait_for("permissions violation", "storage.evt.quota_changed")
    await billing.publish("$JS.API.CONSUMER.DURABLE.CREATE.TESSERA_STORAGE.billing__storage_volume_changed", b"{}")
    await refusals.wait_for("permissions violation", "$JS.API.CONSUMER.DURABLE.CREATE")


async def test_ops_publishes_nothing_but_reads_a_streams_events(connect, nc):
    ops, refusals = await connect("ops")
    await ops.publish("allocation.cmd.request", b"{}")
    await refusals.wait_for("permissions violation", "publish", "allocation.cmd.request")
    await ops.publish("$JS.API.STREAM.PURGE.TESSERA_SCHEDULER", b"{}")
    await refusals.wait_for("permissions violation", "$JS.API.STREAM.PURGE.TESSERA_SCHEDULER")

    js = nc.jetstream()
    await declare_streams(js)
    got: asyncio.Queue = asyncio.Queue()
    sub = await ops.jetstream().subscribe("scheduler.evt.node_changed", stream="TESSERA_SCHEDULER", ordered_consumer=True,
                                          deliver_policy=DeliverPolicy.NEW, cb=got.put)
    try:
        ack = await js.publish("scheduler.evt.node_changed", b'{"probe": "ops"}')
        msg = await asyncio.wait_for(got.get(), 10)
        assert msg.data == b'{"probe": "ops"}' and msg.metadata.sequence.stream == ack.seq
        assert not [e for e in refusals.errors if "node_changed" in e or "$JS.API.CONSUMER" in e]
    finally:
        await sub.unsubscribe()
        await js.purge_stream("TESSERA_SCHEDULER", subject="scheduler.evt.node_changed")


async def test_a_service_answers_the_requests_it_owns_and_publishes_to_no_inbox_unasked(connect):
    node_agent, agent_refusals = await connect("node_agent")
    gateway, _ = await connect("gateway")
    subject = "node_agent.rpc.console.n-1"   # node_agent.read_console

    async def answer(msg) -> None:
        await msg.respond(b"tail")

    sub = await node_agent.subscribe(subject, queue="node_agent", cb=answer)
    await node_agent.flush()
    try:
        assert (await gateway.request(subject, b"{}", timeout=10)).data == b"tail"   # allow_responses
        await node_agent.publish("_INBOX_gateway.unasked", b"x")                    # no request, no reply right
        await agent_refusals.wait_for("permissions violation", "_INBOX_gateway.unasked")
    finally:
        await sub.unsubscribe()
    billing, refusals = await connect("billing")
    await billing.publish(subject, b"{}")    # not in billing's sends
    await refusals.wait_for("permissions violation", "publish", subject)
