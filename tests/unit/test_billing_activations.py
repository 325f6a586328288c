"""Billing meters an allocation from its activation (allocation.activated) to its stop (the release's stop_meter,
the reschedule's pause, allocation.failed), whichever of them comes first: they come on different consumers.
Over an in-memory repository and fixed clocks (no I/O)."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from services.allocation.contracts import AllocationActivated
from services.billing import contracts as c
from services.billing import handlers
from services.billing.domain.model import Meter
from services.billing.handlers.activations import activation_step, stop_until
from shared.wire import step_key
from tests.support.fakes import FakeMeterRepository

T0 = datetime(2030, 1, 1, tzinfo=UTC)
TENANT, USER = uuid.uuid4(), uuid.uuid4()
QUOTE = {"price_list_version": "2030-01", "currency": "USD", "micros_per_gpu_hour": 2_500_000, "sku_id": "vm.2gpu",
         "gpu_count": 2, "hourly_amount": "5", "quoted_at": T0.isoformat()}


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def activated(alloc: uuid.UUID, at: datetime, **over) -> AllocationActivated:
    saga = uuid.uuid4()
    fields = dict(allocation_id=alloc, tenant_id=TENANT, state="ACTIVE", at=at, saga_id=saga, step="activate",
                  idempotency_key=step_key(saga, "activate"), node_id=uuid.uuid4(), shape="vm.2gpu", gpu_count=2,
                  user_id=USER, gpu_model="H100", pool="west", price=QUOTE)
    return AllocationActivated(**(fields | over))


def stop_cmd(alloc: uuid.UUID, at: datetime | None = None, step: str = "stop_meter") -> c.StopMeter:
    saga = uuid.uuid4()
    return c.StopMeter(saga_id=saga, step=step, idempotency_key=step_key(saga, step), allocation_id=alloc,
                       tenant_id=TENANT, at=at)


class Rated(list):
    """The meters handed over to be rated (their usage recorded), in order."""

    async def __call__(self, meter: Meter) -> None:
        self.append((meter.started_at, meter.stopped_at))


def stretches(repo: FakeMeterRepository, alloc: uuid.UUID) -> list[tuple[datetime, datetime | None]]:
    return sorted((m.started_at, m.stopped_at) for m in repo.of(alloc))


async def test_an_activation_meters_from_its_time_with_what_the_event_tells_and_once_however_often_told():
    repo, alloc, rated = FakeMeterRepository(), uuid.uuid4(), Rated()
    evt = activated(alloc, t(5))
    meter = await activation_step(repo, evt, stopped=rated)
    again = await activation_step(repo, evt.model_copy(update={"saga_id": uuid.uuid4()}), stopped=rated)
    assert again is None and stretches(repo, alloc) == [(t(5), None)] and rated == []
    assert (meter.shape, meter.gpu_count, meter.user_id, meter.gpu_model, meter.pool) == ("vm.2gpu", 2, USER, "H100", "west")
    assert (meter.price.micros_per_gpu_hour, meter.price.price_list_version) == (2_500_000, "2030-01")


async def test_a_release_stop_that_overtakes_the_activation_is_kept_and_the_activation_is_metered_up_to_it():
    repo, alloc, rated = FakeMeterRepository(), uuid.uuid4(), Rated()
    reply = await handlers.stop_step(repo, stop_cmd(alloc), clock=lambda: t(65), stopped=rated)
    assert reply == {} and repo.of(alloc) == [] and repo.stops_ahead == {(alloc, t(65))}
    meter = await activation_step(repo, activated(alloc, t(5)), stopped=rated)
    assert (meter.stopped_at, meter.gpu_seconds) == (t(65), 120.0)
    assert rated == [(t(5), t(65))] and repo.stops_ahead == set()   # rated at once; the kept stop is used up
    assert stretches(repo, alloc) == [(t(5), t(65))]


async def test_a_moved_allocation_is_metered_for_each_stretch_whatever_order_its_activations_and_pause_come_in():
    """Activated at 0, interrupted at 100 (the pause), activated again at 160 on the new node: the pause comes
    first, then the second activation, then the first."""
    repo, alloc, rated = FakeMeterRepository(), uuid.uuid4(), Rated()
    await handlers.stop_step(repo, stop_cmd(alloc, at=t(100), step="pause_meter"), clock=lambda: t(130))
    await activation_step(repo, activated(alloc, t(160)), stopped=rated)
    assert stretches(repo, alloc) == [(t(160), None)]          # the pause is older: not this activation's stop
    await activation_step(repo, activated(alloc, t(0)), stopped=rated)
    assert stretches(repo, alloc) == [(t(0), t(100)), (t(160), None)] and rated == [(t(0), t(100))]
    await handlers.stop_step(repo, stop_cmd(alloc), clock=lambda: t(200), stopped=rated)   # released
    assert stretches(repo, alloc) == [(t(0), t(100)), (t(160), t(200))] and repo.stops_ahead == set()


async def test_each_stop_kept_goes_to_the_activation_it_ended_the_earliest_at_or_after_it():
    repo, alloc, rated = FakeMeterRepository(), uuid.uuid4(), Rated()
    await stop_until(repo, alloc, t(100))                      # the pause of the first stretch
    await stop_until(repo, alloc, t(300))                      # the release of the second
    await activation_step(repo, activated(alloc, t(160)), stopped=rated)
    await activation_step(repo, activated(alloc, t(0)), stopped=rated)
    assert stretches(repo, alloc) == [(t(0), t(100)), (t(160), t(300))] and repo.stops_ahead == set()


async def test_a_failed_allocation_stops_metering_when_it_failed_before_or_after_its_activation_is_told():
    repo, running, late, rated = FakeMeterRepository(), uuid.uuid4(), uuid.uuid4(), Rated()
    await activation_step(repo, activated(running, t(0)), stopped=rated)
    await stop_until(repo, running, t(50), stopped=rated)      # its allocation.failed
    await stop_until(repo, late, t(50), stopped=rated)         # failed before its activation was told
    await activation_step(repo, activated(late, t(20)), stopped=rated)
    assert stretches(repo, running) == [(t(0), t(50))] and stretches(repo, late) == [(t(20), t(50))]
    assert rated == [(t(0), t(50)), (t(20), t(50))]


async def test_a_meter_its_saga_started_before_ends_at_the_activation_so_nothing_is_metered_twice():
    """A saga started before billing metered activations ran its own start_meter step just before it activated."""
    repo, alloc, rated = FakeMeterRepository(), uuid.uuid4(), Rated()
    await repo.add(Meter(uuid.uuid4(), alloc, TENANT, "vm.2gpu", 2, t(0)))
    await activation_step(repo, activated(alloc, t(1)), stopped=rated)
    assert stretches(repo, alloc) == [(t(0), t(1)), (t(1), None)] and rated == [(t(0), t(1))]


async def test_an_activation_that_tells_no_spec_meters_nothing():
    repo, alloc = FakeMeterRepository(), uuid.uuid4()
    assert await activation_step(repo, activated(alloc, t(0), shape=None, gpu_count=None)) is None
    assert repo.of(alloc) == []


async def test_a_stop_dated_before_the_running_meter_started_stops_it_at_its_start():
    """The interruption's time can be before the activation it ends (the node failed as it was activated)."""
    repo, alloc, rated = FakeMeterRepository(), uuid.uuid4(), Rated()
    await activation_step(repo, activated(alloc, t(10)), stopped=rated)
    await stop_until(repo, alloc, t(4), stopped=rated)
    assert stretches(repo, alloc) == [(t(10), t(10))] and repo.stops_ahead == set()
