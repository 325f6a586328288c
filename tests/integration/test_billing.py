"""Billing against real NATS JetStream and PostgreSQL: outbox → JetStream → inbox, redelivery, roles."""
from __future__ import annotations

import uuid

import asyncpg
import pytest

from services.billing.bootstrap import build
from shared.wire import step_key
from tests.support.bus import caused_by, make_envelope, publish_envelope


def start_cmd(alloc: uuid.UUID, tenant: uuid.UUID, saga: uuid.UUID) -> dict:
    return {"saga_id": saga, "step": "start_meter", "idempotency_key": step_key(saga, "start_meter"),
            "allocation_id": alloc, "tenant_id": tenant, "shape": "vm.2gpu", "gpu_count": 2}


async def test_start_meter_command_yields_one_meter_and_one_reply_even_when_delivered_twice(run_service, nc, watch, provision):
    rt = await run_service("billing", build)
    alloc, tenant, saga = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    replies = await watch("billing.evt.>")
    env = make_envelope("billing.start_meter", start_cmd(alloc, tenant, saga), tenant_id=tenant, correlation_id=str(alloc))
    js = nc.jetstream()
    await publish_envelope(js, "billing.cmd.start_meter", env)
    # the same envelope again under another Nats-Msg-Id: the server cannot dedupe it, the inbox must
    await publish_envelope(js, "billing.cmd.start_meter", env, msg_id=f"again-{env.id}")
    hits = await replies.wait_for(
        lambda i: i[1]["type"] == "billing.meter_started" and i[1]["data"]["allocation_id"] == str(alloc))
    assert hits[0][1]["causation_id"] == str(env.id)
    assert hits[0][1]["correlation_id"] == str(alloc)
    async with rt.pool.acquire() as conn:
        # wait until both deliveries were handled: the inbox holds the id once, and the meter once
        assert await conn.fetchval("SELECT count(*) FROM meters WHERE allocation_id=$1", alloc) == 1
        assert await conn.fetchval("SELECT count(*) FROM inbox WHERE event_id=$1", env.id) == 1
    # a third, distinct command with the same idempotency key re-answers, and still makes one meter
    env2 = make_envelope("billing.start_meter", start_cmd(alloc, tenant, saga), tenant_id=tenant, correlation_id=str(alloc))
    await publish_envelope(js, "billing.cmd.start_meter", env2)
    await replies.wait_for(caused_by(env2))
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM meters WHERE allocation_id=$1", alloc) == 1


async def test_compensated_key_makes_a_late_start_a_failure_with_no_meter(run_service, nc, watch):
    rt = await run_service("billing", build)
    alloc, tenant, saga = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    replies = await watch("billing.evt.>")
    js = nc.jetstream()
    stop = {"saga_id": saga, "step": "stop_meter", "idempotency_key": step_key(saga, "stop_meter"), "allocation_id": alloc,
            "tenant_id": tenant, "compensates": step_key(saga, "start_meter")}
    await publish_envelope(js, "billing.cmd.stop_meter", make_envelope("billing.stop_meter", stop, tenant_id=tenant))
    await replies.wait_for(lambda i: i[1]["type"] == "billing.meter_stopped" and i[1]["data"]["allocation_id"] == str(alloc))
    await publish_envelope(js, "billing.cmd.start_meter", make_envelope("billing.start_meter", start_cmd(alloc, tenant, saga)))
    hits = await replies.wait_for(
        lambda i: i[1]["type"] == "billing.meter_start_failed" and i[1]["data"]["allocation_id"] == str(alloc))
    assert "compensated" in hits[0][1]["data"]["reason"]
    async with rt.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM meters WHERE allocation_id=$1", alloc) == 0


async def test_billing_role_cannot_read_another_services_schema(provision):
    other = await provision("scheduler")
    billing = await provision("billing")
    conn = await asyncpg.connect(other)
    await conn.execute("CREATE TABLE IF NOT EXISTS scheduler.secret_probe (x int)")
    await conn.close()
    conn = await asyncpg.connect(billing)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetch("SELECT * FROM scheduler.secret_probe")
    finally:
        await conn.close()
