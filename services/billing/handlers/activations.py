"""Billing meters what the allocation service says runs: a meter starts at an allocation's activation
(``allocation.activated``: its time, and what billing prices the usage by) and stops on the release's
``stop_meter``, the reschedule's pause (both saga steps: handlers/__init__.py) or the allocation's
``allocation.failed`` (an allocation that failed while it ran, or was activated after its saga gave up on it).

These come on different consumers, in no order among them. A stop that finds no meter of the allocation running
overtook the activation it ends: it is kept (``keep_stop_ahead``), and that activation, when it comes, is metered
up to it at once (the earliest kept stop at or after the activation's time). So each stretch an allocation ran is
metered once, from its activation to its stop, whichever of them came first.

A stop kept for ``KEPT_FOR`` without its activation coming is forgotten (``forget_stale_stops``, hourly on the
leader): most are an allocation.failed of an allocation that never ran, whose activation never comes.

An activation already metered (the event redelivered, the step's reply repeated) does nothing. A meter still
running from an earlier activation when a later one comes (a saga started before billing metered activations ran
its own start_meter step, just before it activated the allocation) ends at the later activation.
"""
from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import asyncpg
import structlog

from services.allocation.contracts import AllocationActivated, AllocationFailed
from shared.envelope import utcnow
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from ..adapters.repository import PgMeterRepository, forget_kept_before
from ..contracts import StartMeter
from ..domain.model import Meter, QuotedPrice
from ..domain.ports import MeterRepository
from .rating import meter_stopped

log = structlog.get_logger()

Stopped = Callable[[Meter], Awaitable[object]]
# how long a stop waits for the activation it overtook: far longer than any consumer lags behind another
KEPT_FOR = timedelta(days=30)
FORGET_EVERY_S = 3600   # how often the leader forgets them
RepositoryFactory = Callable[[asyncpg.Connection], MeterRepository]


def new_meter(msg: AllocationActivated | StartMeter, started_at: datetime) -> Meter:
    """A meter of the message's allocation, from ``started_at``, with its shape, GPUs and terms (``MeterTerms``)."""
    return Meter(uuid.uuid4(), msg.allocation_id, msg.tenant_id, msg.shape, msg.gpu_count, started_at,
                 user_id=msg.user_id, gpu_model=msg.gpu_model, pool=msg.pool, spot=msg.spot,
                 price=QuotedPrice.from_doc(msg.price.model_dump()) if msg.price is not None else None)


async def stop_until(meters: MeterRepository, allocation_id: uuid.UUID, until: datetime, *,
                     stopped: Stopped | None = None) -> Meter | None:
    """Stop the allocation's running meter at ``until`` (never before its start or the usage already recorded)
    and return it; ``stopped`` gets it while it is locked (its usage is rated there). With none running, the stop
    overtook the activation it ends: kept for it, and None returned."""
    meter = await meters.get_for_allocation(allocation_id)
    if meter is None or not meter.running:
        await meters.keep_stop_ahead(allocation_id, until)
        log.info("billing.stop_kept_for_its_activation", allocation_id=str(allocation_id), at=until.isoformat())
        return None
    meter.stop(until)
    await meters.save_stop(meter)
    if stopped is not None:
        await stopped(meter)
    return meter


async def activation_step(meters: MeterRepository, evt: AllocationActivated, *,
                          stopped: Stopped | None = None) -> Meter | None:
    """Meter the allocation from its activation (see the module); returns the new meter (None: nothing to do).
    ``stopped`` gets each meter this stops while it is locked: the new one when its stop came first, an earlier
    activation's still running."""
    if evt.shape is None or evt.gpu_count is None:   # a reply recorded before it told the spec: its saga metered it
        log.warning("billing.activation_without_spec", allocation_id=str(evt.allocation_id))
        return None
    current = await meters.get_for_allocation(evt.allocation_id)   # the allocation's meters locked from here
    if await meters.metered_from(evt.allocation_id, evt.at):
        return None
    meter = new_meter(evt, evt.at)
    until = await meters.take_stop_ahead(evt.allocation_id, evt.at)
    if until is not None:
        meter.stop(until)
    elif current is not None and current.running:
        if current.started_at > evt.at:   # a later activation's meter runs, and no stop ended this one
            log.warning("billing.activation_overtaken", allocation_id=str(evt.allocation_id), at=evt.at.isoformat())
            return None
        current.stop(evt.at)
        await meters.save_stop(current)
        if stopped is not None:
            await stopped(current)
    await meters.add_activation(meter)
    if meter.stopped_at is not None and stopped is not None:
        await stopped(meter)
    return meter


async def on_activated(ctx: UnitOfWork, evt: AllocationActivated, *, grace_s: int | None = None,
                       repository: RepositoryFactory = PgMeterRepository) -> None:
    """Start the allocation's meter at its activation, rating at once what a stop that came first ended."""
    await activation_step(repository(ctx.conn), evt, stopped=lambda m: meter_stopped(ctx, m, grace_s=grace_s))


async def on_failed(ctx: UnitOfWork, evt: AllocationFailed, *, grace_s: int | None = None,
                    repository: RepositoryFactory = PgMeterRepository) -> None:
    """A failed allocation holds nothing: its running meter stops when it failed (kept for its activation if that
    has not come yet)."""
    await stop_until(repository(ctx.conn), evt.allocation_id, evt.at,
                     stopped=lambda m: meter_stopped(ctx, m, grace_s=grace_s))


async def forget_stale_stops(rt: Runtime, *, now: datetime | None = None) -> int:
    """Forget the stops kept longer than ``KEPT_FOR`` (their activation never came); returns how many."""
    async with rt.pool.acquire() as conn:
        gone = await forget_kept_before(conn, (now or utcnow()) - KEPT_FOR)
    if gone:
        log.info("billing.stale_stops_forgotten", stops=gone)
    return gone
