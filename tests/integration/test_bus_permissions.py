"""The bus's authentication and contract-derived permissions, against the suite's nats-server (run with the
configuration the embedded runner renders from tooling.bus_permissions): no credentials, no connection; an
identity publishes and subscribes only where its contract says (a node-agent only for its own node:
test_bus_node_identities.py). That each service's identity can do its job is shown by the rest of the suite, which
runs every service with its own."""
from __future__ import annotations

import asyncio
import uuid

import nats
import nats.errors
import pytest
from nats.js.api import DeliverPolicy

from shared.bus_identity import node_identity
from shared.streams import declare_streams
from tests.support.polling import eventually

NODE_A, NODE_B = str(uuid.uuid4()), str(uuid.uuid4())


async def test_a_connection_without_credentials_is_refused(infra):
    with pytest.raises(nats.errors.Error, match="(?i)authorization violation"):
        await nats.connect(infra.nats_url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=5)


async def test_a_seed_the_server_does_not_know_is_refused(infra, tmp_path):
    import secrets

    import nkeys

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
    await billing.publish("$JS.API.CONSUMER.CREATE.TESSERA_STORAGE.billing__storage_volume_changed"
                          ".storage.evt.quota_changed", b"{}")
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


async def _request(client, subject: str):
    """The answer, or None while the server knows no responder yet."""
    try:
        return await client.request(subject, b"{}", timeout=10)
    except nats.errors.NoRespondersError:
        return None


async def test_a_service_answers_the_requests_it_owns_and_publishes_to_no_inbox_unasked(connect):
    node_agent, agent_refusals = await connect(node_identity(NODE_A))
    gateway, _ = await connect("gateway")
    subject = f"node_agent.rpc.console.{NODE_A}"   # node_agent.read_console

    async def answer(msg) -> None:
        await msg.respond(b"tail")

    sub = await node_agent.subscribe(subject, queue="node_agent", cb=answer)
    await node_agent.flush()
    try:
        # right after the configuration reload that made NODE_A's identity, the server may take a moment to route
        # to a new subscription (seen: "no responders" for up to ~0.1 s, then the answer), so ask until it answers
        reply = await eventually(lambda: _request(gateway, subject), timeout=10, what="the node-agent to answer")
        assert reply.data == b"tail"                                                   # allow_responses
        await node_agent.publish("_INBOX_gateway.unasked", b"x")                    # no request, no reply right
        await agent_refusals.wait_for("permissions violation", "_INBOX_gateway.unasked")
    finally:
        await sub.unsubscribe()
    billing, refusals = await connect("billing")
    await billing.publish(subject, b"{}")    # not in billing's sends
    await refusals.wait_for("permissions violation", "publish", subject)


@pytest.fixture(scope="module")
def tls_nats(tmp_path_factory):
    """A nats-server as deploy/compose runs it: TLS with a certificate of the private CA `tooling.bus_keys` makes,
    and its generated authorization block. Yields (url, secrets folder, a CA that signed nothing of it)."""
    import subprocess

    from tooling.bus_keys import main
    from tooling.embedded import _bin, free_port, wait_port

    work = tmp_path_factory.mktemp("tls-nats")
    assert main([str(work / "s"), "--nats-host", "localhost", "--nats-host", "127.0.0.1"]) == 0
    assert main([str(work / "stranger"), "--nats-host", "localhost"]) == 0
    tls = work / "s" / "tls"
    conf = work / "nats.conf"
    conf.write_text(f'tls {{\n  cert_file: "{tls / "nats.crt"}"\n  key_file: "{tls / "nats.key"}"\n}}\n'
                    f'include "./s/nats/authorization.conf"\n')
    port = free_port()
    with open(work / "nats.log", "wb") as log:
        proc = subprocess.Popen([_bin("nats-server"), "-c", str(conf), "-a", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc=proc)
        yield f"tls://localhost:{port}", work / "s", work / "stranger" / "tls" / "ca.crt"
    finally:
        proc.terminate()
        proc.wait(10)


async def test_a_service_connects_over_tls_verifying_the_server_and_nothing_else_connects(tls_nats):
    """What a deployed service does (shared.runtime.nats_security: its seed and TESSERA_NATS_CA_FILE): it connects;
    the same without the CA, or with a CA that did not sign the server's certificate, does not."""
    import ssl

    from faststream.nats.security import parse_security

    from shared.runtime import nats_security
    from shared.settings import ServiceSettings

    url, secrets, stranger_ca = tls_nats
    seed = str(secrets / "nats" / "identities" / "billing.nk")

    def options(ca) -> dict:
        settings = ServiceSettings(service="billing", nats_url=url, nats_nkey_file=seed, nats_ca_file=ca and str(ca))
        return {**parse_security(nats_security(settings)), "allow_reconnect": False, "max_reconnect_attempts": 0,
                "connect_timeout": 5, "inbox_prefix": "_INBOX_billing"}

    nc = await nats.connect(url, **options(secrets / "tls" / "ca.crt"))
    try:
        assert nc.is_connected and nc.connected_url.scheme == "tls"
        await nc.flush()
    finally:
        await nc.close()
    failures: list[BaseException] = []

    async def note(exc: Exception) -> None:
        failures.append(exc)

    with pytest.raises((OSError, nats.errors.Error)):   # the TLS failure, or nats-py's 'no servers'
        await nats.connect(url, error_cb=note, **options(stranger_ca))     # a server this CA did not certify: refused
    assert any(isinstance(e, ssl.SSLCertVerificationError) for e in failures), failures
    failures.clear()
    with pytest.raises((OSError, nats.errors.Error)):   # the TLS failure, or nats-py's 'no servers'
        await nats.connect(url.replace("tls://", "nats://"), nkeys_seed=seed, allow_reconnect=False, error_cb=note,
                           max_reconnect_attempts=0, connect_timeout=5)
    # no plain connection: the server demands TLS (nats-py then tries it, and without the CA cannot verify)
    assert any(isinstance(e, ssl.SSLCertVerificationError) for e in failures), failures
