"""Billing's step handlers over an in-memory repository and a fixed clock (no I/O): one meter per allocation,
started and stopped idempotently, GPU-seconds = GPUs × elapsed seconds."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from services.billing import contracts as c
from services.billing import handlers
from services.billing.domain.model import Meter
from shared.wire import step_key
from tests.support.fakes import FakeMeterRepository

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TENANT = uuid.uuid4()


def clock(seconds: float):
    return lambda: T0 + timedelta(seconds=seconds)


def start_cmd(alloc: uuid.UUID, gpu_count: int = 2) -> c.StartMeter:
    saga = uuid.uuid4()
    return c.StartMeter(saga_id=saga, step="start_meter", idempotency_key=step_key(saga, "start_meter"),
                        allocation_id=alloc, tenant_id=TENANT, shape=f"vm.{gpu_count}gpu", gpu_count=gpu_count)


def stop_cmd(alloc: uuid.UUID) -> c.StopMeter:
    saga = uuid.uuid4()
    return c.StopMeter(saga_id=saga, step="stop_meter", idempotency_key=step_key(saga, "stop_meter"),
                       allocation_id=alloc, tenant_id=TENANT)


async def test_start_creates_one_running_meter_with_the_allocations_shape_and_gpus_from_now():
    repo, alloc = FakeMeterRepository(), uuid.uuid4()
    cmd = start_cmd(alloc, gpu_count=4)
    reply = await handlers.start_step(repo, cmd, clock=clock(0))
    meter = repo.meters[alloc]
    assert (meter.tenant_id, meter.shape, meter.gpu_count, meter.started_at, meter.running) == (
        TENANT, "vm.4gpu", 4, T0, True)
    assert reply == {"meter_id": meter.id, "started_at": T0}
    c.MeterStarted(saga_id=cmd.saga_id, step=cmd.step, idempotency_key=cmd.idempotency_key, allocation_id=alloc, **reply)


async def test_starting_again_returns_the_running_meter_and_creates_no_second():
    repo, alloc = FakeMeterRepository(), uuid.uuid4()
    first = await handlers.start_step(repo, start_cmd(alloc), clock=clock(0))
    again = await handlers.start_step(repo, start_cmd(alloc), clock=clock(60))   # another key, a minute later
    assert again == first
    assert list(repo.meters) == [alloc] and repo.meters[alloc].started_at == T0


async def test_stop_records_gpu_seconds_as_gpus_times_elapsed_seconds():
    repo, alloc = FakeMeterRepository(), uuid.uuid4()
    started = await handlers.start_step(repo, start_cmd(alloc, gpu_count=2), clock=clock(0))
    cmd = stop_cmd(alloc)
    reply = await handlers.stop_step(repo, cmd, clock=clock(90.5))
    assert reply == {"meter_id": started["meter_id"], "gpu_seconds": 181.0}
    assert repo.meters[alloc].stopped_at == T0 + timedelta(seconds=90.5) and not repo.meters[alloc].running
    c.MeterStopped(saga_id=cmd.saga_id, step=cmd.step, idempotency_key=cmd.idempotency_key, allocation_id=alloc, **reply)


async def test_stopping_again_keeps_the_first_stop_time_and_keeps_the_second_for_an_activation_to_come():
    """A second stop finds nothing running: it is kept for the activation it may have overtook (activations.py)."""
    alloc = uuid.uuid4()
    repo = FakeMeterRepository(Meter(uuid.uuid4(), alloc, TENANT, "vm.8gpu", 8, T0))
    first = await handlers.stop_step(repo, stop_cmd(alloc), clock=clock(10))
    again = await handlers.stop_step(repo, stop_cmd(alloc), clock=clock(3600))
    assert first["gpu_seconds"] == 80.0 and again == {}
    assert repo.meters[alloc].stopped_at == T0 + timedelta(seconds=10)
    assert repo.stops_ahead == {(alloc, T0 + timedelta(seconds=3600))}


async def test_a_stop_dated_before_the_start_measures_zero_gpu_seconds():
    alloc = uuid.uuid4()
    repo = FakeMeterRepository(Meter(uuid.uuid4(), alloc, TENANT, "vm.2gpu", 2, T0))
    assert (await handlers.stop_step(repo, stop_cmd(alloc), clock=clock(-5)))["gpu_seconds"] == 0.0
    assert repo.meters[alloc].stopped_at == T0


async def test_stopping_an_allocation_without_a_meter_keeps_the_stop_and_replies_without_one():
    other = Meter(uuid.uuid4(), uuid.uuid4(), TENANT, "vm.2gpu", 2, T0)
    repo, alloc = FakeMeterRepository(other), uuid.uuid4()
    cmd = stop_cmd(alloc)
    reply = await handlers.stop_step(repo, cmd, clock=clock(10))
    assert reply == {} and list(repo.meters) == [other.allocation_id] and repo.meters[other.allocation_id].running
    assert repo.stops_ahead == {(alloc, T0 + timedelta(seconds=10))}   # for the activation it overtook
    stopped = c.MeterStopped(saga_id=cmd.saga_id, step=cmd.step, idempotency_key=cmd.idempotency_key,
                             allocation_id=alloc, **reply)
    assert (stopped.meter_id, stopped.gpu_seconds) == (None, 0.0)


async def test_start_keeps_the_quoted_price_on_the_meter():
    repo, alloc = FakeMeterRepository(), uuid.uuid4()
    quote = c.PriceSnapshot(price_list_version="v7", currency="USD", micros_per_gpu_hour=3_600_000,
                            spot_discount_bps=1000, spot=True, sku_id="gpu-hour:default", gpu_count=2,
                            hourly_amount="6.48", quoted_at=T0)
    await handlers.start_step(repo, start_cmd(alloc).model_copy(update={"price": quote}), clock=clock(0))
    price = repo.meters[alloc].price
    assert (price.price_list_version, price.micros_per_gpu_hour, price.spot_discount_bps, price.spot,
            price.sku_id) == ("v7", 3_600_000, 1000, True, "gpu-hour:default")


async def test_a_stop_is_never_dated_before_the_usage_already_cut():
    alloc = uuid.uuid4()
    cut = T0 + timedelta(seconds=60)
    repo = FakeMeterRepository(Meter(uuid.uuid4(), alloc, TENANT, "vm.2gpu", 2, T0, cut_until=cut))
    reply = await handlers.stop_step(repo, stop_cmd(alloc), clock=clock(30))   # a replica's clock behind
    assert repo.meters[alloc].stopped_at == cut and reply["gpu_seconds"] == 120.0
