"""Billing's saga-step handlers: start a meter, stop it (both idempotent per key).

The sagas no longer start meters: billing meters an allocation from its ``allocation.activated``
(handlers/activations.py). ``start_meter`` stays for a saga started before that, which still sends it.

A meter stores the price its allocation was quoted (``StartMeter.price``, ``AllocationActivated.price``); the
stop records the usage the running cuts (handlers/meters.py) have not, [cut_until or started_at, stopped_at).

A reschedule pauses an allocation's metering and resumes it: its saga stops the meter at the interruption
(``StopMeter.at``), and its activation on the new node starts a new meter (a segment) for the same allocation.
Its usage then has a hole where the tenant had no GPUs.

Each step's effect (``start_step``, ``stop_step``) is a function of the ``MeterRepository``
port, the command and a clock, returning the reply's fields; the handlers run it through
``shared.participant`` on a repository their ``repository`` factory builds on the unit of
work's connection (the asyncpg one unless told otherwise).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg

from shared.envelope import utcnow
from shared.participant import invoke, over, undo
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.repository import PgMeterRepository
from ..domain.model import Meter
from ..domain.ports import MeterRepository
from .activations import new_meter, stop_until
from .rating import meter_stopped
from .rating import publish_price_list as publish_prices

RepositoryFactory = Callable[[asyncpg.Connection], MeterRepository]
Clock = Callable[[], datetime]


async def start_step(meters: MeterRepository, cmd: c.StartMeter, *, clock: Clock = utcnow) -> dict:
    """The start step's effect: the allocation's meter runs from now (its running meter, not a second, if it
    has one; a new meter, a segment, if its last one was stopped); returns the reply's fields."""
    meter = await meters.get_for_allocation(cmd.allocation_id)
    if meter is None or not meter.running:
        meter = new_meter(cmd, clock())
        await meters.add(meter)
    return {"meter_id": meter.id, "started_at": meter.started_at}


async def stop_step(meters: MeterRepository, cmd: c.StopMeter, *, clock: Clock = utcnow,
                    stopped: Callable[[Meter], Awaitable[object]] | None = None) -> dict:
    """The stop step's effect: the allocation's running meter stops at ``cmd.at`` or now, whichever is earlier
    (never before its start or the usage already recorded); returns that meter and the GPU-seconds it measured.
    With none running, the stop overtook the activation it ends (activations.py): it is kept for it, and the
    reply names no meter. ``stopped`` gets the stopped meter while it is still locked (the handler meters and
    rates its usage there: rating.meter_stopped)."""
    now = clock()
    at = cmd.at if cmd.at is None or cmd.at.tzinfo is not None else cmd.at.replace(tzinfo=UTC)   # zoneless: UTC
    meter = await stop_until(meters, cmd.allocation_id, min(at, now) if at is not None else now, stopped=stopped)
    return {} if meter is None else {"meter_id": meter.id, "gpu_seconds": meter.gpu_seconds}


async def start_meter(ctx: UnitOfWork, cmd: c.StartMeter, *, sim_faults: bool = False,
                      repository: RepositoryFactory = PgMeterRepository) -> None:
    await invoke(ctx, cmd, over(repository, start_step), step=c.START_METER, sim_faults=sim_faults,
                 optimistic=True)


async def stop_meter(ctx: UnitOfWork, cmd: c.StopMeter, *, repository: RepositoryFactory = PgMeterRepository,
                     grace_s: int | None = None) -> None:
    """Stop the meter and, in the same unit of work, record, rate and ledger its usage (rating.meter_stopped)."""
    async def step(meters: MeterRepository, command: c.StopMeter) -> dict:
        return await stop_step(meters, command, stopped=lambda meter: meter_stopped(ctx, meter, grace_s=grace_s))
    await undo(ctx, cmd, over(repository, step), step=c.START_METER)


async def publish_price_list(ctx: UnitOfWork, cmd: c.PublishPriceList) -> None:
    await publish_prices(ctx, cmd)
