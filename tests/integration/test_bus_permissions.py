"""The bus's authentication and contract-derived permissions, against the suite's nats-server (run with the
configuration the embedded runner renders from tooling.bus_permissions): no credentials, no connection; an
identity publishes and subscribes only where its contract says; a node-agent only for its own node (each
node's identity is made, and the server reloaded, when it is first used). That each service's identity can do its
job is shown by the rest of the suite, which runs every service with its own."""
from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

import nats
import nats.errors
import pytest
from nats.js.api import DeliverPolicy

from shared.bus_identity import node_identity
from shared.contract import ServiceContract, durable_name
from shared.streams import declare_streams
from tests.support.bus import make_envelope, probe_runtime, publish_envelope
from tests.support.polling import eventually

NODE_A, NODE_B = str(uuid.uuid4()), str(uuid.uuid4())


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
        infra.nkey_file(identity)    # a node-agent's identity is made (and the server reloaded) on first use
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


async def test_a_node_agent_cannot_speak_for_another_node_and_nobody_sees_the_forgery(connect, nc):
    agent_a, refusals = await connect(node_identity(NODE_A))
    seen: list[str] = []
    got_own = asyncio.Event()

    async def on_msg(msg) -> None:
        seen.append(msg.subject)
        if msg.subject.endswith(NODE_A):
            got_own.set()

    sub = await nc.subscribe("node_agent.evt.power_changed.*", cb=on_msg)
    await nc.flush()
    js = nc.jetstream()
    await declare_streams(js)
    before = (await js.stream_info("TESSERA_NODE_AGENT")).state.last_seq
    try:
        await agent_a.publish(f"node_agent.evt.power_changed.{NODE_B}", b'{"forged": true}')
        await agent_a.publish(f"node_agent.evt.power_changed.{NODE_A}", b'{"marker": true}')   # its own: allowed
        await refusals.wait_for("permissions violation", "publish", f"node_agent.evt.power_changed.{NODE_B}")
        await asyncio.wait_for(got_own.wait(), 10)      # in order: the refused one would have come first
        assert seen == [f"node_agent.evt.power_changed.{NODE_A}"]
        assert (await js.stream_info("TESSERA_NODE_AGENT")).state.last_seq == before + 1   # only its own was stored
    finally:
        await sub.unsubscribe()
        await js.purge_stream("TESSERA_NODE_AGENT", subject=f"node_agent.evt.power_changed.{NODE_A}")


async def test_a_node_agent_cannot_listen_to_another_nodes_commands_requests_or_durables(connect):
    agent_a, refusals = await connect(node_identity(NODE_A))
    for subject in (f"node_agent.cmd.provision.{NODE_B}", f"node_agent.rpc.console.{NODE_B}", "node_agent.cmd.>",
                    f"_INBOX_{node_identity(NODE_B)}.>"):
        await agent_a.subscribe(subject)
        await refusals.wait_for("permissions violation", "subscription", f'"{subject}"')
    durable_b = f"{node_identity(NODE_B)}__provision"
    await agent_a.publish(f"$JS.API.CONSUMER.CREATE.TESSERA_NODE_AGENT.{durable_b}.node_agent.cmd.provision.{NODE_B}", b"{}")
    await refusals.wait_for("permissions violation", durable_b)
    # its own durable, filtered on another node's commands
    own = f"{node_identity(NODE_A)}__provision"
    await agent_a.publish(f"$JS.API.CONSUMER.CREATE.TESSERA_NODE_AGENT.{own}.node_agent.cmd.provision.{NODE_B}", b"{}")
    await refusals.wait_for("permissions violation", f"{own}.node_agent.cmd.provision.{NODE_B}")
    await agent_a.subscribe(f"node_agent.cmd.provision.{NODE_A}")   # its own: allowed
    await agent_a.flush()
    assert not any(f"provision.{NODE_A}\"" in e for e in refusals.errors)


FORGEPROBE = ServiceContract(service="forgeprobe", title="forgeprobe", description="test-only consumer of a node's events",
                             messages=[], receives=["node_agent.power_changed"])


def _power_changed(node_id: str) -> dict:
    return {"request_id": uuid.uuid4(), "allocation_id": uuid.uuid4(), "tenant_id": uuid.uuid4(), "node_id": node_id,
            "action": "reboot", "requested_by": uuid.uuid4(), "ok": True, "power_state": "running",
            "at": "2026-01-01T00:00:00+00:00"}


async def test_an_event_whose_payload_names_another_node_than_its_subject_is_dead_lettered_as_forged(
        infra, provision, nc, watch, connect):
    """Published as admin (who may publish anywhere): the server cannot know what a payload says, its consumers
    check it. The handler never runs; the dead letter names both nodes; operators (``ops``) read it."""
    js = nc.jetstream()
    await declare_streams(js)
    handled: list[str] = []
    rt = probe_runtime(FORGEPROBE, infra.nats_url, await provision("forgeprobe"), nkey_file=infra.nkey_file("admin"))

    async def on_power_changed(ctx, event) -> None:
        handled.append(str(event.node_id))

    rt.consumers.subscribe("node_agent.power_changed", on_power_changed)
    forged_feed = await watch("deadletter.*.*.forged")
    ops, _ = await connect("ops")
    ops_saw: asyncio.Queue = asyncio.Queue()
    ops_sub = await ops.jetstream().subscribe("deadletter.forgeprobe.>", stream="TESSERA_DEADLETTER",
                                              ordered_consumer=True, deliver_policy=DeliverPolicy.NEW, cb=ops_saw.put)
    await rt.start()
    try:
        forged = make_envelope("node_agent.power_changed", _power_changed(NODE_B))
        genuine = make_envelope("node_agent.power_changed", _power_changed(NODE_A))
        await publish_envelope(js, f"node_agent.evt.power_changed.{NODE_A}", forged)
        await publish_envelope(js, f"node_agent.evt.power_changed.{NODE_A}", genuine)
        [(subject, body, headers)] = await forged_feed.wait_for(lambda i: i[1]["id"] == str(forged.id))
        durable = durable_name("forgeprobe", "node_agent.power_changed")
        assert subject == f"deadletter.forgeprobe.{durable}.forged"
        assert headers["Tessera-DLQ-Reason"] == "forged"
        assert headers["Tessera-DLQ-Subject-Node"] == NODE_A and headers["Tessera-DLQ-Payload-Node"] == NODE_B
        assert headers["Tessera-DLQ-Subject"] == f"node_agent.evt.power_changed.{NODE_A}"
        seen = await asyncio.wait_for(ops_saw.get(), 10)                 # operators see it as it happens
        assert seen.headers["Tessera-DLQ-Reason"] == "forged" and json.loads(seen.data)["id"] == str(forged.id)
        await eventually(lambda: list(handled), timeout=10, until=lambda h: h == [NODE_A], what="the genuine event handled")
        assert NODE_B not in handled                                     # the forged one never was
    finally:
        await ops_sub.unsubscribe()
        await rt.stop()
        await js.purge_stream("TESSERA_NODE_AGENT", subject=f"node_agent.evt.power_changed.{NODE_A}")


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


async def test_node_agents_share_one_outbox_and_each_relay_publishes_its_own_nodes_rows_only(
        infra, provision, connect, watch):
    """Every node-agent writes to the same outbox table (one schema for the service): a relay's table pass must not
    take another node's rows, which the server would refuse from it (and the row would wait for a publish timeout)."""
    from shared.bus_identity import publish_scope
    from shared.db import create_pool, migrate
    from shared.outbox import OutboxRelay

    pool = await create_pool(await provision("relayprobe"), "relayprobe", min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            await migrate(conn, "relayprobe", None)
            await conn.execute("DELETE FROM outbox")
            rows = {}
            for node in (NODE_A, NODE_B):
                env = make_envelope("node_agent.power_changed", _power_changed(node))
                rows[node] = env.id
                await conn.execute("INSERT INTO outbox (id, subject, type, headers, body) VALUES ($1, $2, $3, $4, $5)",
                                   env.id, f"node_agent.evt.power_changed.{node}", env.type, json.dumps(env.headers()),
                                   env.model_dump_json().encode())
        events = await watch("node_agent.evt.power_changed.*")
        agent_a, refusals = await connect(node_identity(NODE_A))
        relay = OutboxRelay(pool, agent_a.jetstream(), "node_agent", scope=publish_scope("node_agent", NODE_A))
        assert await relay.drain_once() == 1
        [(subject, body, _)] = await events.wait_for(lambda i: i[1]["id"] == str(rows[NODE_A]))
        assert subject == f"node_agent.evt.power_changed.{NODE_A}"
        async with pool.acquire() as conn:
            waiting = await conn.fetch("SELECT id FROM outbox WHERE published_at IS NULL")
        assert [r["id"] for r in waiting] == [rows[NODE_B]]          # node B's agent publishes it
        assert not refusals.errors
    finally:
        await pool.close()
        nc_js = (await connect("admin"))[0].jetstream()
        await nc_js.purge_stream("TESSERA_NODE_AGENT", subject=f"node_agent.evt.power_changed.{NODE_A}")


async def test_a_node_agent_reports_only_its_own_nodes_topology_and_a_forged_report_is_dead_lettered(
        connect, nc, watch, run_service):
    """``scheduler.report_topology`` travels on the reporting node's subject: the server refuses node A's report on
    node B's subject, and the scheduler dead-letters (as forged, never handled) a report whose payload names
    another node than its subject (published here as admin, who may publish anywhere)."""
    from services.node_agent.adapters.discovery.sim import sim_topology
    from services.scheduler.bootstrap import build as scheduler_build
    agent_a, refusals = await connect(node_identity(NODE_A))
    js = nc.jetstream()
    await declare_streams(js)
    before = (await js.stream_info("TESSERA_SCHEDULER")).state.last_seq
    await agent_a.publish(f"scheduler.cmd.report_topology.{NODE_B}", b"{}")
    await refusals.wait_for("permissions violation", "publish", f"scheduler.cmd.report_topology.{NODE_B}")
    await agent_a.flush()
    assert (await js.stream_info("TESSERA_SCHEDULER")).state.last_seq == before    # nothing stored
    await run_service("scheduler", scheduler_build)
    forged_feed = await watch("deadletter.scheduler.*.forged")
    forged = make_envelope("scheduler.report_topology",
                           {"node_id": NODE_B, "driver": "sim", "topology": sim_topology("forged-node").to_dict()})
    await publish_envelope(js, f"scheduler.cmd.report_topology.{NODE_A}", forged)
    [(subject, _, headers)] = await forged_feed.wait_for(lambda i: i[1]["id"] == str(forged.id))
    assert subject == f"deadletter.scheduler.{durable_name('scheduler', 'scheduler.report_topology')}.forged"
    assert headers["Tessera-DLQ-Subject-Node"] == NODE_A and headers["Tessera-DLQ-Payload-Node"] == NODE_B
