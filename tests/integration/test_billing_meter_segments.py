"""A reschedule's pause and resume of an allocation's meter against real NATS JetStream and PostgreSQL: the pause
stops the meter at the interruption, the resume (another saga, other keys) starts a second meter for the same
allocation, and usage holds the two stretches with a hole between them."""
from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

from services.billing.bootstrap import build
from shared.wire import step_key
from tests.support.bus import send_command
from tests.support.polling import eventually


def _step(alloc: uuid.UUID, tenant: uuid.UUID, step: str, **extra) -> dict:
    saga = uuid.uuid4()
    return {"saga_id": saga, "step": step, "idempotency_key": step_key(saga, step), "allocation_id": alloc,
            "tenant_id": tenant, **extra}


def _seconds(d: timedelta) -> Decimal:
    return Decimal(d.days * 86400 + d.seconds) + Decimal(d.microseconds) / 10**6


async def test_start_pause_at_the_interruption_resume_stop_bills_the_two_stretches_only(run_service, nc, watch):
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, cut_s=0))
    js, replies = nc.jetstream(), await watch("billing.evt.>")
    alloc, tenant = uuid.uuid4(), uuid.uuid4()

    async def send(type_: str, reply: str, cmd: dict) -> dict:
        await send_command(js, type_, cmd)
        [hit] = await replies.wait_for(lambda i: i[1]["type"] == reply and
                                       i[1]["data"]["idempotency_key"] == cmd["idempotency_key"])
        return hit[1]["data"]

    first = await send("billing.start_meter", "billing.meter_started",
                       _step(alloc, tenant, "start_meter", shape="vm.2gpu", gpu_count=2))
    async with rt.pool.acquire() as conn:
        started = await conn.fetchval("SELECT started_at FROM meters WHERE id=$1", uuid.UUID(first["meter_id"]))
    lost = started + timedelta(milliseconds=300)

    async def now():
        async with rt.pool.acquire() as conn:
            return await conn.fetchval("SELECT clock_timestamp()")
    await eventually(now, until=lambda t: t > lost, timeout=10, what="the interruption in the past")
    paused = await send("billing.stop_meter", "billing.meter_stopped",
                        _step(alloc, tenant, "pause_meter", at=lost.isoformat()))
    second = await send("billing.start_meter", "billing.meter_started",
                        _step(alloc, tenant, "start_meter", shape="vm.2gpu", gpu_count=2))
    assert second["meter_id"] != first["meter_id"]
    await send("billing.stop_meter", "billing.meter_stopped", _step(alloc, tenant, "stop_meter"))

    async with rt.pool.acquire() as conn:
        meters = await conn.fetch("SELECT id, started_at, stopped_at, gpu_seconds FROM meters WHERE allocation_id=$1 "
                                  "ORDER BY started_at", alloc)
        records = await conn.fetch("SELECT period_start, period_end, quantity FROM usage_records "
                                   "WHERE allocation_id=$1 ORDER BY period_start", alloc)
    assert [m["id"] for m in meters] == [uuid.UUID(first["meter_id"]), uuid.UUID(second["meter_id"])]
    assert meters[0]["stopped_at"] == lost and paused["gpu_seconds"] == 0.6
    resumed = meters[1]["started_at"]
    assert resumed > lost
    expected = 2 * (_seconds(lost - started) + _seconds(meters[1]["stopped_at"] - resumed))
    assert sum(r["quantity"] for r in records) == expected      # the two stretches, nothing for the gap
    assert not any(r["period_start"] < resumed and r["period_end"] > lost for r in records)
