"""A node-agent's bus identity is its node's (each node's identity is made, and the server reloaded, when it is
first used): it publishes, subscribes and consumes only its own node's subjects, its outbox relay publishes only
its node's rows, and an event or report whose payload names another node than its subject is dead-lettered as
forged by the services that consume it."""
from __future__ import annotations

import asyncio
import json
import uuid

from nats.js.api import DeliverPolicy

from shared.bus_identity import node_identity
from shared.contract import ServiceContract, durable_name
from shared.streams import declare_streams
from tests.support.bus import make_envelope, probe_runtime, publish_envelope
from tests.support.polling import eventually

NODE_A, NODE_B = str(uuid.uuid4()), str(uuid.uuid4())


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
            # a command to another service on node B's subject is node B's agent's too
            report = make_envelope("scheduler.report_topology", {"node_id": NODE_B, "driver": "sim", "topology": {}})
            await conn.execute("INSERT INTO outbox (id, subject, type, headers, body) VALUES ($1, $2, $3, $4, $5)",
                               report.id, f"scheduler.cmd.report_topology.{NODE_B}", report.type,
                               json.dumps(report.headers()), report.model_dump_json().encode())
        events = await watch("node_agent.evt.power_changed.*")
        agent_a, refusals = await connect(node_identity(NODE_A))
        relay = OutboxRelay(pool, agent_a.jetstream(), "node_agent", scope=publish_scope("node_agent", NODE_A))
        assert await relay.drain_once() == 1
        [(subject, body, _)] = await events.wait_for(lambda i: i[1]["id"] == str(rows[NODE_A]))
        assert subject == f"node_agent.evt.power_changed.{NODE_A}"
        async with pool.acquire() as conn:
            waiting = await conn.fetch("SELECT id FROM outbox WHERE published_at IS NULL")
        assert {r["id"] for r in waiting} == {rows[NODE_B], report.id}     # node B's agent publishes them
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
