"""Billing meters an allocation from its allocation.activated to its stop, against real NATS JetStream and
PostgreSQL: the billing service runs (its real bootstrap); the test plays the allocation service and the sagas.
The activation and the stops come on different consumers: whichever comes first, each stretch is metered once,
from the activation's time to the stop's."""
from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

from services.billing.bootstrap import build
from services.billing.handlers.activations import KEPT_FOR, forget_stale_stops
from shared.envelope import utcnow
from shared.wire import step_key
from tests.support.bus import publish_event, send_command
from tests.support.polling import eventually


def activated(alloc: uuid.UUID, tenant: uuid.UUID, at) -> dict:
    saga = uuid.uuid4()
    return {"allocation_id": alloc, "tenant_id": tenant, "state": "ACTIVE", "at": at.isoformat(), "saga_id": saga,
            "step": "activate", "idempotency_key": step_key(saga, "activate"), "node_id": uuid.uuid4(),
            "shape": "vm.2gpu", "gpu_count": 2, "user_id": uuid.uuid4(), "gpu_model": "H100", "pool": "shared"}


def stop(alloc: uuid.UUID, tenant: uuid.UUID) -> dict:
    saga = uuid.uuid4()
    return {"saga_id": saga, "step": "stop_meter", "idempotency_key": step_key(saga, "stop_meter"),
            "allocation_id": alloc, "tenant_id": tenant}


async def metered(rt, alloc: uuid.UUID) -> tuple[list, Decimal, int]:
    """(the allocation's meters as (started_at, stopped_at), the GPU-seconds of its usage records, stops kept)."""
    async with rt.pool.acquire() as conn:
        meters = await conn.fetch("SELECT started_at, stopped_at FROM meters WHERE allocation_id=$1 ORDER BY started_at",
                                  alloc)
        used = await conn.fetchval("SELECT coalesce(sum(quantity), 0) FROM usage_records WHERE allocation_id=$1", alloc)
        kept = await conn.fetchval("SELECT count(*) FROM meter_stops_ahead WHERE allocation_id=$1", alloc)
    return [(m["started_at"], m["stopped_at"]) for m in meters], used, kept


async def test_a_release_stop_that_comes_before_the_activation_meters_the_stretch_once_it_comes(run_service, nc, watch):
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, cut_s=0))
    js, replies = nc.jetstream(), await watch("billing.evt.meter_stopped")
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    cmd = stop(alloc, tenant)
    await send_command(js, "billing.stop_meter", cmd)
    [reply] = await replies.wait_for(lambda i: i[1]["data"]["idempotency_key"] == cmd["idempotency_key"])
    assert reply[1]["data"]["meter_id"] is None                     # nothing runs yet: the stop is kept
    meters, _, kept = await metered(rt, alloc)
    assert (meters, kept) == ([], 1)

    began = utcnow() - timedelta(seconds=60)                          # activated before the release was asked
    await publish_event(js, "allocation.activated", activated(alloc, tenant, began), tenant_id=tenant)
    meters, used, kept = await eventually(lambda: metered(rt, alloc), until=lambda m: m[0], timeout=20,
                                          what="the activation metered")
    [(start, end)] = meters
    assert start == began and end > began and kept == 0
    assert used == 2 * Decimal(str((end - start).total_seconds()))   # rated at once, up to the stop


async def test_an_activation_meters_once_however_often_told_and_a_failure_stops_it(run_service, nc):
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, cut_s=0))
    js, alloc, tenant = nc.jetstream(), uuid.uuid4(), uuid.uuid4()
    began = utcnow() - timedelta(seconds=90)
    evt = activated(alloc, tenant, began)
    told = [await publish_event(js, "allocation.activated", evt, tenant_id=tenant),
            await publish_event(js, "allocation.activated", evt | {"saga_id": uuid.uuid4()}, tenant_id=tenant)]

    async def both_handled() -> bool:
        async with rt.pool.acquire() as conn:
            return await conn.fetchval("SELECT count(*) FROM inbox WHERE event_id = ANY($1::uuid[])",
                                       [e.id for e in told]) == 2
    await eventually(both_handled, timeout=20, what="both activations handled")
    assert (await metered(rt, alloc))[0] == [(began, None)]

    failed_at = began + timedelta(seconds=30)
    await publish_event(js, "allocation.failed", {"allocation_id": alloc, "tenant_id": tenant, "state": "FAILED",
                                                  "at": failed_at.isoformat(), "failed_step": "reschedule",
                                                  "reason": "node lost 3 times"}, tenant_id=tenant)
    meters, used, kept = await eventually(lambda: metered(rt, alloc), until=lambda m: m[0][0][1] is not None,
                                          timeout=20, what="the meter stopped")
    assert meters == [(began, failed_at)] and used == Decimal(60) and kept == 0


async def test_a_stop_kept_longer_than_any_consumer_lags_is_forgotten_and_a_younger_one_is_not(run_service):
    rt = await run_service("billing", lambda s: build(s, checkpoint_s=0, cut_s=0))
    old, young = uuid.uuid4(), uuid.uuid4()
    async with rt.pool.acquire() as conn:
        await conn.execute("INSERT INTO meter_stops_ahead (allocation_id, at, kept_at) VALUES "
                           "($1, now(), now() - $3::interval), ($2, now(), now() - $4::interval)", old, young,
                           KEPT_FOR + timedelta(minutes=1), KEPT_FOR - timedelta(minutes=1))
    assert await forget_stale_stops(rt) == 1
    async with rt.pool.acquire() as conn:
        assert [r["allocation_id"] for r in await conn.fetch("SELECT allocation_id FROM meter_stops_ahead "
                                                             "WHERE allocation_id = ANY($1::uuid[])", [old, young])] == [young]
