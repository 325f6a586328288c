"""Running meters cut into usage records while they run, so a tenant sees its usage (and its draft invoice)
grow, not only when an allocation is released.

Every ``cut_s`` each replica cuts the running meters: in one transaction per batch it takes up to ``BATCH``
meters with usage not yet recorded (``FOR UPDATE SKIP LOCKED``: a meter a stop or another replica holds is
left to it), records [cut_until or started_at, now) as usage (domain/usage.py: pieces at UTC hours, keyed
``meter:<meter id>@<piece start>``), rates it and moves ``cut_until`` to now, all in that transaction. The stop
records the rest under the same row lock (handlers/rating.py::meter_stopped). A repeated cut has nothing left
to record; a crash before commit loses nothing (the next cut records the same interval).
"""
from __future__ import annotations

from datetime import datetime

import structlog

from shared.envelope import utcnow
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from ..adapters import repository as meters_repo
from ..domain.usage import meter_records
from .rating import rate_and_record

log = structlog.get_logger()
BATCH = 100


async def cut(rt: Runtime, *, now: datetime | None = None, grace_s: int | None = None) -> int:
    """Record the usage of every running meter up to ``now`` (default: the current time); returns how many
    usage records were new. Idempotent: cutting again at the same instant records nothing."""
    now = now or utcnow()
    total = 0
    while True:
        async with UnitOfWork.begin(rt.pool, rt.outbox, name="billing.cut_meters") as uow:
            meters = await meters_repo.running_to_cut(uow.conn, now, BATCH)
            records = [r for m in meters for r in meter_records(m, now)]
            total += await rate_and_record(uow, records, grace_s=grace_s)
            for m in meters:
                await meters_repo.save_cut(uow.conn, m.id, now)
        if len(meters) < BATCH:
            break
    if total:
        log.info("billing.meters_cut", records=total, until=now.isoformat())
    return total

