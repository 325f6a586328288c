"""The shared bus kit against real JetStream and PostgreSQL: outbox relay, inbox, retries, dead letters.

A probe service with its own contract and stream exercises the kit without any real service's logic.
"""
from __future__ import annotations

import json
import uuid

import pytest
from nats.js.api import DeliverPolicy, StreamConfig
from pydantic import BaseModel, ConfigDict

from shared.contract import ContractViolation, Message, ServiceContract
from tests.support.bus import make_envelope, probe_runtime, publish_envelope
from tests.support.polling import eventually


class Ping(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int
    poison: bool = False


PROBE = ServiceContract(
    service="probe", title="probe", description="test-only service",
    messages=[Message("probe.ping", "probe.cmd.ping", Ping, "command", "ping"),
              Message("probe.pinged", "probe.evt.pinged", Ping, "event", "pinged")],
    receives=["probe.ping"],
)


@pytest.fixture
async def probe(infra, provision, nc):
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="TESSERA_PROBE", subjects=["probe.>"], duplicate_window=120))
    handled: list[int] = []
    attempts: dict[int, int] = {}
    rt = probe_runtime(PROBE, infra.nats_url, await provision("probe"), nkey_file=infra.nkey_file("admin"), max_workers=4)

    async def on_ping(ctx, ping: Ping):
        attempts[ping.n] = attempts.get(ping.n, 0) + 1
        if ping.poison:
            raise RuntimeError(f"poison {ping.n}")
        handled.append(ping.n)
        await ctx.emit("probe.pinged", ping)

    rt.consumers.subscribe("probe.ping", on_ping)
    await rt.start()
    rt.handled, rt.attempts = handled, attempts
    yield rt
    await rt.stop()


async def test_poison_message_is_dead_lettered_after_bounded_retries_while_others_flow(probe, nc, watch):
    dlq = await watch("deadletter.probe.>")
    events = await watch("probe.evt.pinged")
    js = nc.jetstream()
    base = uuid.uuid4().int % 10**6 * 10
    poison = make_envelope("probe.ping", {"n": base, "poison": True})
    await publish_envelope(js, "probe.cmd.ping", poison)
    for i in range(1, 4):
        await publish_envelope(js, "probe.cmd.ping", make_envelope("probe.ping", {"n": base + i}))
    await events.wait_for(lambda i: i[1]["data"]["n"] == base + 3)
    dead = await dlq.wait_for(lambda i: json.loads(json.dumps(i[1]))["id"] == str(poison.id))
    headers = dead[0][2]
    assert headers["Tessera-DLQ-Reason"] == "max_deliveries"
    assert headers["Tessera-DLQ-Deliveries"] == "3"
    assert "poison" in headers["Tessera-DLQ-Error"]
    # bounded: max_deliver (3) deliveries, each run once in its batch and, when that batch held others, once
    # more alone under a savepoint (which of its deliveries shared a batch depends on arrival)
    assert 3 <= probe.attempts[base] <= 6
    assert {base + 1, base + 2, base + 3} <= set(probe.handled)


async def test_malformed_payload_is_dead_lettered_at_once(probe, nc, watch):
    dlq = await watch("deadletter.probe.>")
    bad = make_envelope("probe.ping", {"n": "not-a-number"})
    await publish_envelope(nc.jetstream(), "probe.cmd.ping", bad)
    dead = await dlq.wait_for(lambda i: i[1]["id"] == str(bad.id))
    assert dead[0][2]["Tessera-DLQ-Reason"] == "invalid"
    assert dead[0][2]["Tessera-DLQ-Deliveries"] == "1"


async def test_not_json_at_all_is_dead_lettered(probe, nc):
    marker = uuid.uuid4().hex
    sub = await nc.jetstream().subscribe("deadletter.probe.>", ordered_consumer=True,
                                         deliver_policy=DeliverPolicy.NEW)
    await nc.jetstream().publish("probe.cmd.ping", f"garbage {marker}".encode())
    try:
        msg = await eventually(lambda: sub.next_msg(timeout=10), until=lambda m: marker.encode() in m.data, timeout=10,
                               interval=0, what="the garbage message in deadletter.probe.>")
        assert msg.headers["Tessera-DLQ-Reason"] == "invalid"
    finally:
        await sub.unsubscribe()


async def test_outbox_row_committed_late_with_lower_sequence_is_still_published(probe, watch):
    events = await watch("probe.evt.pinged")
    n_early, n_late = 900_000_000 + uuid.uuid4().int % 10**6, 800_000_000 + uuid.uuid4().int % 10**6
    slow = await probe.pool.acquire()
    fast = await probe.pool.acquire()
    try:
        tx_slow = slow.transaction()
        await tx_slow.start()
        await probe.outbox.add(slow, "probe.pinged", Ping(n=n_late), correlation_id="late")  # takes the lower seq
        async with fast.transaction():
            await probe.outbox.add(fast, "probe.pinged", Ping(n=n_early), correlation_id="early")
        await events.wait_for(lambda i: i[1]["data"]["n"] == n_early)
        await tx_slow.commit()
        await events.wait_for(lambda i: i[1]["data"]["n"] == n_late)
    finally:
        await probe.pool.release(slow)
        await probe.pool.release(fast)


async def test_rolled_back_outbox_row_is_never_published(probe, watch):
    events = await watch("probe.evt.pinged")
    n_rolled, n_after = uuid.uuid4().int % 10**9, uuid.uuid4().int % 10**9 + 10**9
    async with probe.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await probe.outbox.add(conn, "probe.pinged", Ping(n=n_rolled), correlation_id="x")
        await tx.rollback()
        async with conn.transaction():
            await probe.outbox.add(conn, "probe.pinged", Ping(n=n_after), correlation_id="x")
    await events.wait_for(lambda i: i[1]["data"]["n"] == n_after)
    assert not [i for i in events.items if i[1]["data"]["n"] == n_rolled]
    async with probe.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE body::text LIKE $1", f"%{n_rolled}%") == 0


async def test_republished_outbox_row_is_dropped_by_the_servers_duplicate_window(probe, nc):
    """A relay that crashed after publishing but before marking the row republishes it: one copy lands."""
    js = nc.jetstream()
    async with probe.pool.acquire() as conn:
        async with conn.transaction():
            # hold the relay off this row while we play the crashed relay's first publish
            env = await probe.outbox.add(conn, "probe.pinged", Ping(n=1), correlation_id="dup")
            row = await conn.fetchrow("SELECT subject, headers, body FROM outbox WHERE id=$1", env.id)
            first = await js.publish(row["subject"], bytes(row["body"]), headers=json.loads(row["headers"]))

    async def published() -> bool:
        async with probe.pool.acquire() as conn:
            return await conn.fetchval("SELECT published_at IS NOT NULL FROM outbox WHERE id=$1", env.id)
    await eventually(published, timeout=10, interval=0.02, what="the relay to publish the row")
    again = await js.publish(row["subject"], bytes(row["body"]), headers=json.loads(row["headers"]))
    assert again.duplicate and again.seq == first.seq


async def test_outbox_refuses_messages_no_contract_defines(probe):
    async with probe.pool.acquire() as conn:
        with pytest.raises(ContractViolation):
            await probe.outbox.add(conn, "probe.unknown", Ping(n=1), correlation_id="x")
        with pytest.raises(ContractViolation):   # an event owned by another service
            from services.billing.contracts import MeterStopped
            await probe.outbox.add(conn, "billing.meter_stopped", MeterStopped(
                saga_id=uuid.uuid4(), step="s", idempotency_key="k", allocation_id=uuid.uuid4()), correlation_id="x")
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE type = 'probe.unknown'") == 0


async def test_purge_forgets_old_published_rows_and_inbox_entries_but_keeps_unpublished(probe):
    async with probe.pool.acquire() as conn:
        async with conn.transaction():
            # hold the relay off: these rows are ours to age by hand
            old_pub = await probe.outbox.add(conn, "probe.pinged", Ping(n=1), correlation_id="purge")
            pending = await probe.outbox.add(conn, "probe.pinged", Ping(n=2), correlation_id="purge")
            await conn.execute("UPDATE outbox SET published_at = now() - interval '2 hours' WHERE id = $1", old_pub.id)
            await conn.execute("UPDATE outbox SET published_at = NULL, created_at = now() - interval '2 hours' "
                               "WHERE id = $1", pending.id)
            old_in, new_in = uuid.uuid4(), uuid.uuid4()
            await conn.execute("INSERT INTO inbox (consumer, event_id, processed_at) "
                               "VALUES ('purge-test', $1, now() - interval '9 days'), ('purge-test', $2, now())",
                               old_in, new_in)
        await probe.relay.purge()
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE id = $1", old_pub.id) == 0
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE id = $1", pending.id) == 1
        assert await conn.fetchval("SELECT array_agg(event_id) FROM inbox WHERE consumer = 'purge-test'") == [new_in]


async def test_a_durable_left_with_an_older_subject_is_brought_to_the_contracts_at_start(infra, provision, nc, watch):
    """A contract that moves a message to another subject (as scheduler.report_topology moved onto its node's
    subject) finds its durable, on an installation that ran before, filtered on the old one: the kit updates the
    filter at start (the durable keeps its name and position) and the message on the new subject is handled."""
    from nats.js.api import AckPolicy, ConsumerConfig

    from shared.contract import durable_name
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="TESSERA_PROBE", subjects=["probe.>"], duplicate_window=120))
    name = durable_name("probe", "probe.ping")
    await js.add_consumer("TESSERA_PROBE", ConsumerConfig(durable_name=name, filter_subject="probe.cmd.ping_before",
                                                          ack_policy=AckPolicy.EXPLICIT))
    handled: list[int] = []
    rt = probe_runtime(PROBE, infra.nats_url, await provision("probe"), nkey_file=infra.nkey_file("admin"))

    async def on_ping(ctx, ping: Ping):
        handled.append(ping.n)
    rt.consumers.subscribe("probe.ping", on_ping)
    await rt.start()
    try:
        assert (await js.consumer_info("TESSERA_PROBE", name)).config.filter_subject == "probe.cmd.ping"
        n = uuid.uuid4().int % 10**6
        await publish_envelope(js, "probe.cmd.ping", make_envelope("probe.ping", {"n": n}))
        await eventually(lambda: n in handled, timeout=10, what="the ping on the contract's subject handled")
    finally:
        await rt.stop()


async def test_a_consumer_keeps_one_pull_request_open_rather_than_asking_for_each_message(probe, nc, watch):
    """Each ping is published only once the previous one was handled, so each arrives at an idle consumer: a
    fetch per message would send at least one pull request per ping (nats-py's fetch of one sends two)."""
    requests: list[dict] = []

    async def count(msg) -> None:
        requests.append(json.loads(msg.data))

    spy = await nc.subscribe("$JS.API.CONSUMER.MSG.NEXT.TESSERA_PROBE.>", cb=count)
    events = await watch("probe.evt.pinged")
    js = nc.jetstream()
    base = uuid.uuid4().int % 10**6 * 10
    try:
        for i in range(10):
            await publish_envelope(js, "probe.cmd.ping", make_envelope("probe.ping", {"n": base + i}))
            await events.wait_for(lambda item, n=base + i: item[1]["data"]["n"] == n)
    finally:
        await spy.unsubscribe()
    assert {base + i for i in range(10)} <= set(probe.handled)
    # the request open when the first ping came, and at most one renewal (one expiring during the run)
    assert len(requests) <= 2, requests
    assert all(r["batch"] > 1 and r["expires"] > 0 for r in requests)
