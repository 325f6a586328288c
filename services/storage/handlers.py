"""Storage's handlers: provision the allocation's volume within the tenant's quota (saga step),
delete it (undo).

The quota check and the insert are one atomic decision: the tenant's quota row
is locked (``FOR UPDATE``) before its current use is summed, so concurrent
provisions for one tenant are serialised and can never overshoot the limit.
"""
from __future__ import annotations

import uuid
from functools import partial

import asyncpg

from shared.unit_of_work import UnitOfWork
from shared.envelope import utcnow
from shared.participant import StepRejected, invoke, undo

from . import contracts as c
from .adapters import repository
from .domain.model import Quota, QuotaExceeded, StoragePolicy, Volume


async def _provision(conn: asyncpg.Connection, cmd: c.ProvisionVolume, *, policy: StoragePolicy) -> dict:
    if cmd.size_gb == 0:
        return {"volume_id": None, "size_gb": 0}
    existing = await repository.volume_for(conn, cmd.allocation_id)
    if existing is not None:  # provisioned before under another key: the same answer, no second volume
        return {"volume_id": existing.id, "size_gb": existing.size_gb}
    quota = Quota.of(cmd.tenant_id, await repository.lock_quota(conn, cmd.tenant_id), policy)
    try:
        quota.check(await repository.used_gb(conn, cmd.tenant_id), cmd.size_gb)
    except QuotaExceeded as exc:
        raise StepRejected(str(exc)) from None
    volume = Volume(uuid.uuid4(), cmd.allocation_id, cmd.tenant_id, cmd.size_gb, utcnow())
    await repository.add(conn, volume)
    return {"volume_id": volume.id, "size_gb": volume.size_gb}


async def _delete(conn: asyncpg.Connection, cmd: c.DeleteVolume) -> dict:
    await repository.delete_for(conn, cmd.allocation_id)
    return {}


async def provision_volume(ctx: UnitOfWork, cmd: c.ProvisionVolume, *, policy: StoragePolicy,
                           sim_faults: bool = False) -> None:
    """Saga step: create the volume (none for size 0), once per key; over quota → failure naming the numbers."""
    await invoke(ctx, cmd, partial(_provision, policy=policy), succeeded="storage.volume_provisioned",
                 failed="storage.volume_provision_failed", reply_model=c.VolumeProvisioned,
                 failure_model=c.VolumeProvisionFailed, sim_faults=sim_faults)


async def delete_volume(ctx: UnitOfWork, cmd: c.DeleteVolume) -> None:
    """Saga step or compensation: delete the allocation's volume (idempotent; safe if there was none)."""
    await undo(ctx, cmd, _delete, undone="storage.volume_deleted", reply_model=c.VolumeDeleted)
