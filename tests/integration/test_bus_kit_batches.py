"""The kit handles a fetched batch in one transaction, and keeps every guarantee of one message at a time:
a crash between the batch's commit and its acks has no second effect when the batch is redelivered; a poison
message in a batch is retried and dead-lettered alone while its neighbours' effects commit.

The probe (tests/support/batchprobe.py) has its own contract, stream and schema; messages are published before
it starts, so its first fetch takes them all as one batch.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from shared.contract import Catalog
from shared.db import create_pool, migrate
from shared.outbox import Outbox, OutboxRelay
from shared.unit_of_work import UnitOfWork
from tests.support import batchprobe
from tests.support.bus import make_envelope, publish_envelope
from tests.support.polling import eventually

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def probe_env(infra, provision, nc):
    """A fresh stream and consumer, an effects table, and the probe's DSN."""
    await batchprobe.fresh_stream(nc.jetstream())
    dsn = await provision(batchprobe.SERVICE)
    conn = await asyncpg.connect(dsn)
    await conn.execute(batchprobe.EFFECTS)
    await conn.execute("TRUNCATE effects")
    await conn.close()
    return dsn


async def publish_pings(js, pings: list[dict]) -> list:
    envs = [make_envelope(batchprobe.PING, p) for p in pings]
    for env in envs:
        await publish_envelope(js, "batchprobe.cmd.ping", env)
    return envs


async def effects(dsn: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch("SELECT n, txid, pid FROM effects ORDER BY n")
    finally:
        await conn.close()


def spawn_probe(infra, dsn: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TESSERA_NATS_URL": infra.nats_url,
           "TESSERA_NATS_NKEY_FILE": infra.nkey_file("admin"), "TESSERA_DB_DSN": dsn}
    return subprocess.Popen([sys.executable, "-m", "tests.support.batchprobe"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=open(log, "ab"), start_new_session=True)


async def test_a_kill_between_the_commit_and_the_acks_of_a_batch_has_no_second_effect(
        infra, probe_env, nc, watch, tmp_path):
    js = nc.jetstream()
    pinged = await watch("batchprobe.evt.pinged")
    await publish_pings(js, [{"n": n, "kill": n == 9} for n in range(20)])

    first = spawn_probe(infra, probe_env, tmp_path / "probe.log")
    try:
        # the batch commits, then the after-commit hook of ping 9 kills the process before any ack
        await eventually(lambda: first.poll() is not None, timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL
    committed = await effects(probe_env)
    assert [r["n"] for r in committed] == list(range(20))                 # every effect, once
    assert len({r["txid"] for r in committed}) == 1                      # one transaction: one batch
    info = await js.consumer_info(batchprobe.STREAM, batchprobe.CONSUMER)
    assert info.num_ack_pending == 20                                    # and not one of them acknowledged

    second = spawn_probe(infra, probe_env, tmp_path / "probe.log")
    try:
        async def settled() -> bool:
            i = await js.consumer_info(batchprobe.STREAM, batchprobe.CONSUMER)
            return i.num_ack_pending == 0 and i.num_pending == 0 and i.delivered.consumer_seq >= 40
        await eventually(settled, timeout=60, fail_if=lambda _v: second.poll() is not None)
        # the redelivered batch found its inbox rows: no handler ran again
        assert [r["n"] for r in await effects(probe_env)] == list(range(20))
        # the outbox rows the killed process committed are published by the new one, each once
        await pinged.wait_for(lambda _i: len({i[1]["data"]["n"] for i in pinged.items}) == 20, timeout=30)
        assert sorted(i[1]["data"]["n"] for i in pinged.items) == list(range(20))
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(20)
        except subprocess.TimeoutExpired:
            second.kill()


async def test_a_poison_message_in_a_batch_is_retried_and_dead_lettered_alone_while_its_neighbours_commit(
        infra, probe_env, nc, watch):
    js = nc.jetstream()
    dlq = await watch("deadletter.batchprobe.>")
    pinged = await watch("batchprobe.evt.pinged")
    envs = await publish_pings(js, [{"n": n, "poison": n == 3} for n in range(8)])
    rt = batchprobe.build(infra.nats_url, probe_env, nkey_file=infra.nkey_file("admin"), ack_wait_s=5)
    await rt.start()
    try:
        dead = await dlq.wait_for(lambda i: i[1]["id"] == str(envs[3].id), timeout=30)
        headers = dead[0][2]
        assert headers["Tessera-DLQ-Reason"] == "max_deliveries"
        assert headers["Tessera-DLQ-Deliveries"] == "3"
        assert "poison 3" in headers["Tessera-DLQ-Error"]
        done = await effects(probe_env)
        # the neighbours' effects committed, once each, in one transaction with the poison's first attempt
        # (whose own write was rolled back to its savepoint); the poison left no effect
        assert [r["n"] for r in done] == [0, 1, 2, 4, 5, 6, 7]
        assert len({r["txid"] for r in done}) == 1
        await pinged.wait_for(lambda _i: len(pinged.items) >= 7, timeout=30)
        assert sorted(i[1]["data"]["n"] for i in pinged.items) == [0, 1, 2, 4, 5, 6, 7]
        async with rt.pool.acquire() as conn:
            inbox = {r["event_id"] for r in await conn.fetch(
                "SELECT event_id FROM inbox WHERE consumer=$1 AND event_id = ANY($2::uuid[])",
                batchprobe.CONSUMER, [e.id for e in envs])}
        assert inbox == {e.id for i, e in enumerate(envs) if i != 3}
    finally:
        await rt.stop()


async def test_a_batch_of_saga_notices_is_handled_in_one_transaction_at_its_first_delivery(infra, probe_env, nc):
    """A notice (a step command with no idempotency key) has no key to lock and read ahead: a batch of several
    is handled like any other, in one transaction, not failed and retried."""
    await publish_pings(nc.jetstream(), [{"n": n} for n in range(4)])
    rt = batchprobe.build(infra.nats_url, probe_env, nkey_file=infra.nkey_file("admin"), notice=True)
    await rt.start()
    try:
        done = await eventually(lambda: effects(probe_env), until=lambda rows: len(rows) >= 4, timeout=30,
                                what="the four notices' effects")
        assert [r["n"] for r in done] == [0, 1, 2, 3]
        assert len({r["txid"] for r in done}) == 1
    finally:
        await rt.stop()


async def test_messages_the_subscriber_does_not_follow_are_acknowledged_without_a_transaction(infra, probe_env, nc):
    """An ``interest`` that follows even pings: the odd ones have no effect, no inbox row, and are not redelivered;
    the even ones are handled in one transaction as usual."""
    envs = await publish_pings(nc.jetstream(), [{"n": n} for n in range(6)])
    rt = batchprobe.build(infra.nats_url, probe_env, nkey_file=infra.nkey_file("admin"), even_only=True)
    await rt.start()
    try:
        done = await eventually(lambda: effects(probe_env), until=lambda rows: len(rows) >= 3, timeout=30,
                                what="the even pings' effects")
        assert [r["n"] for r in done] == [0, 2, 4] and len({r["txid"] for r in done}) == 1
        info = await eventually(lambda: nc.jetstream().consumer_info(batchprobe.STREAM, batchprobe.CONSUMER),
                                until=lambda i: i.num_ack_pending == 0 and i.num_pending == 0, timeout=30,
                                what="every ping acknowledged")
        assert info.delivered.consumer_seq == 6          # each delivered once: none was redelivered
        async with rt.pool.acquire() as conn:
            inbox = {r["event_id"] for r in await conn.fetch(
                "SELECT event_id FROM inbox WHERE consumer=$1 AND event_id = ANY($2::uuid[])",
                batchprobe.CONSUMER, [e.id for e in envs])}
        assert inbox == {envs[n].id for n in (0, 2, 4)}
        assert [r["n"] for r in await effects(probe_env)] == [0, 2, 4]
    finally:
        await rt.stop()


async def test_a_message_emitted_in_a_savepoint_the_handler_rolled_back_is_never_published(infra, probe_env, nc, watch):
    js = nc.jetstream()
    pinged = await watch("batchprobe.evt.pinged")
    await publish_pings(js, [{"n": n, "retract": True} for n in range(1, 6)])
    rt = batchprobe.build(infra.nats_url, probe_env, nkey_file=infra.nkey_file("admin"))
    await rt.start()
    try:
        await pinged.wait_for(lambda _i: len(pinged.items) >= 5, timeout=30)
        # every committed row is published, then marked (the mark follows the publish); no other row exists
        await eventually(lambda: rt.pool.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL"),
                         until=lambda left: left == 0, timeout=10, what="every outbox row marked published")
        await rt.stop()
        rt = None
        assert sorted(i[1]["data"]["n"] for i in pinged.items) == [1, 2, 3, 4, 5]   # never a -n
    finally:
        if rt is not None:
            await rt.stop()


@pytest.fixture
async def held_back(infra, probe_env):
    """(pool, outbox, handed): the probe's empty outbox table, and an outbox whose hand-overs are kept in
    ``handed`` instead of reaching a relay (the test hands them over itself)."""
    pool = await create_pool(probe_env, batchprobe.SERVICE, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            await migrate(conn, batchprobe.SERVICE, None)
            await conn.execute("DELETE FROM outbox")
        outbox = Outbox(batchprobe.SERVICE, Catalog([batchprobe.CONTRACT]))
        handed: list = []
        outbox.hand_over = handed.extend
        yield pool, outbox, handed
    finally:
        await pool.close()


async def test_a_row_the_table_pass_published_before_its_hand_over_arrived_is_not_published_again(held_back, nc):
    pool, outbox, handed = held_back          # held back: the table pass gets there first
    async with UnitOfWork.begin(pool, outbox, name="test") as uow:
        env = await uow.emit(batchprobe.PINGED, batchprobe.Ping(n=7), correlation_id="late-hand-over")
    assert [r.id for r in handed] == [env.id]
    relay = OutboxRelay(pool, nc.jetstream(), batchprobe.SERVICE)
    assert await relay.drain_once() == 1
    await relay.publish_handed(handed)
    assert relay.published == 1
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0


async def test_the_rows_of_several_hand_overs_are_marked_in_one_statement_and_never_published_twice(held_back, nc):
    """Published rows wait to be marked (``mark_delay_s``) so that many transactions' rows are marked at once; the
    relay's own table pass marks them first and does not publish them again."""
    pool, outbox, handed = held_back
    sent = []
    for n in range(3):
        async with UnitOfWork.begin(pool, outbox, name="test") as uow:
            sent.append((await uow.emit(batchprobe.PINGED, batchprobe.Ping(n=n), correlation_id=f"m-{n}")).id)
    relay = OutboxRelay(pool, nc.jetstream(), batchprobe.SERVICE, mark_delay_s=3600)
    for row in handed:                       # three hand-overs, as three commits would make
        await relay.publish_handed([row])
    assert relay.published == 3
    unmarked = "SELECT id FROM outbox WHERE published_at IS NULL ORDER BY seq"
    assert [r["id"] for r in await pool.fetch(unmarked)] == sent      # published, not marked yet
    await relay.drain()                      # the table pass: marks them, publishes nothing again
    assert relay.published == 3 and await pool.fetch(unmarked) == []
    marked_at = {r["published_at"] for r in await pool.fetch("SELECT published_at FROM outbox")}
    assert len(marked_at) == 1               # one statement marked the three
