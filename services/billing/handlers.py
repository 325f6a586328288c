"""Billing's saga-step handlers: start a meter, stop it (both idempotent per key)."""
from __future__ import annotations

import uuid

import asyncpg

from shared.unit_of_work import UnitOfWork
from shared.envelope import utcnow
from shared.participant import invoke, undo

from . import contracts as c
from .adapters import repository
from .domain.model import Meter


async def _start(conn: asyncpg.Connection, cmd: c.StartMeter) -> dict:
    meter = await repository.get_for_allocation(conn, cmd.allocation_id)
    if meter is None:
        meter = Meter(uuid.uuid4(), cmd.allocation_id, cmd.tenant_id, cmd.shape, cmd.gpu_count, utcnow())
        await repository.add(conn, meter)
    return {"meter_id": meter.id, "started_at": meter.started_at}


async def _stop(conn: asyncpg.Connection, cmd: c.StopMeter) -> dict:
    meter = await repository.get_for_allocation(conn, cmd.allocation_id)
    if meter is None:
        return {}
    meter.stop(utcnow())
    await repository.save_stop(conn, meter)
    return {"meter_id": meter.id, "gpu_seconds": meter.gpu_seconds}


async def start_meter(ctx: UnitOfWork, cmd: c.StartMeter, *, sim_faults: bool = False) -> None:
    await invoke(ctx, cmd, _start, succeeded="billing.meter_started", failed="billing.meter_start_failed",
                 reply_model=c.MeterStarted, failure_model=c.MeterStartFailed, sim_faults=sim_faults)


async def stop_meter(ctx: UnitOfWork, cmd: c.StopMeter) -> None:
    await undo(ctx, cmd, _stop, undone="billing.meter_stopped", reply_model=c.MeterStopped)
