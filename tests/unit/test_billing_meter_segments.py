"""A reschedule pauses an allocation's meter at the interruption and starts it again on the new node: a new meter
(a segment) per stretch, at most one running, and usage with a hole where the tenant had no GPUs. Over an
in-memory repository and fixed clocks (no I/O)."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from services.billing import contracts as c
from services.billing import handlers
from services.billing.domain.model import Meter
from services.billing.domain.usage import meter_records
from shared.wire import step_key
from tests.support.fakes import FakeMeterRepository

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TENANT = uuid.uuid4()


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def clock(seconds: float):
    return lambda: t(seconds)


def start_cmd(alloc: uuid.UUID) -> c.StartMeter:
    saga = uuid.uuid4()
    return c.StartMeter(saga_id=saga, step="start_meter", idempotency_key=step_key(saga, "start_meter"),
                        allocation_id=alloc, tenant_id=TENANT, shape="vm.2gpu", gpu_count=2)


def stop_cmd(alloc: uuid.UUID, at: datetime | None = None) -> c.StopMeter:
    saga = uuid.uuid4()
    return c.StopMeter(saga_id=saga, step="pause_meter", idempotency_key=step_key(saga, "pause_meter"),
                       allocation_id=alloc, tenant_id=TENANT, at=at)


async def test_a_paused_then_resumed_allocation_is_metered_for_its_two_stretches_and_not_the_gap():
    repo, alloc = FakeMeterRepository(), uuid.uuid4()
    first = await handlers.start_step(repo, start_cmd(alloc), clock=clock(0))
    paused = await handlers.stop_step(repo, stop_cmd(alloc, at=t(100)), clock=clock(160))   # lost at 100 s
    second = await handlers.start_step(repo, start_cmd(alloc), clock=clock(400))            # back at 400 s
    stopped = await handlers.stop_step(repo, stop_cmd(alloc), clock=clock(1000))
    assert second["meter_id"] != first["meter_id"] and second["started_at"] == t(400)
    assert (paused["gpu_seconds"], stopped["gpu_seconds"]) == (200.0, 1200.0)
    assert [(m.started_at, m.stopped_at) for m in repo.of(alloc)] == [(t(0), t(100)), (t(400), t(1000))]
    records = [r for m in repo.of(alloc) for r in meter_records(m, m.stopped_at)]
    assert sum(r.quantity for r in records) == 1400          # GPU-seconds of the two stretches only
    assert not any(r.period_start < t(400) and r.period_end > t(100) for r in records)   # nothing in the hole


async def test_a_stop_at_a_moment_after_now_stops_now():
    repo, alloc = FakeMeterRepository(), uuid.uuid4()
    await handlers.start_step(repo, start_cmd(alloc), clock=clock(0))
    await handlers.stop_step(repo, stop_cmd(alloc, at=t(9999)), clock=clock(50))
    assert repo.meters[alloc].stopped_at == t(50)


async def test_a_stop_at_a_moment_before_the_start_or_the_usage_already_recorded_stops_there_instead():
    alloc, other = uuid.uuid4(), uuid.uuid4()
    repo = FakeMeterRepository(Meter(uuid.uuid4(), alloc, TENANT, "vm.2gpu", 2, t(100)),
                               Meter(uuid.uuid4(), other, TENANT, "vm.2gpu", 2, t(0), cut_until=t(60)))
    await handlers.stop_step(repo, stop_cmd(alloc, at=t(10)), clock=clock(500))
    await handlers.stop_step(repo, stop_cmd(other, at=t(30)), clock=clock(500))
    assert (repo.meters[alloc].stopped_at, repo.meters[other].stopped_at) == (t(100), t(60))


async def test_a_stop_with_no_meter_running_leaves_the_last_one_as_it_was_and_waits_for_its_activation():
    repo, alloc = FakeMeterRepository(), uuid.uuid4()
    await handlers.start_step(repo, start_cmd(alloc), clock=clock(0))
    first = await handlers.stop_step(repo, stop_cmd(alloc, at=t(100)), clock=clock(100))
    again = await handlers.stop_step(repo, stop_cmd(alloc), clock=clock(900))
    assert first["gpu_seconds"] == 200.0 and again == {}
    assert [m.stopped_at for m in repo.of(alloc)] == [t(100)] and repo.stops_ahead == {(alloc, t(900))}


async def test_starting_while_a_segment_runs_returns_it_and_starts_no_second():
    repo, alloc = FakeMeterRepository(), uuid.uuid4()
    await handlers.start_step(repo, start_cmd(alloc), clock=clock(0))
    await handlers.stop_step(repo, stop_cmd(alloc), clock=clock(10))
    second = await handlers.start_step(repo, start_cmd(alloc), clock=clock(20))
    again = await handlers.start_step(repo, start_cmd(alloc), clock=clock(30))
    assert again == second and len(repo.of(alloc)) == 2


async def test_a_stop_time_without_a_zone_is_taken_as_utc():
    repo, alloc = FakeMeterRepository(), uuid.uuid4()
    await handlers.start_step(repo, start_cmd(alloc), clock=clock(0))
    await handlers.stop_step(repo, stop_cmd(alloc, at=t(40).replace(tzinfo=None)), clock=clock(100))
    assert repo.meters[alloc].stopped_at == t(40)
