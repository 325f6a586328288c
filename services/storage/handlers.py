"""Storage's handlers: provision the allocation's volume within the tenant's quota (saga step),
delete it (undo).

The quota check and the insert are one atomic decision: the tenant's quota is
locked (``VolumeRepository.lock_quota``) before its current use is summed, so
concurrent provisions for one tenant are serialised and can never overshoot the limit.

Each step's effect (``provision_step``, ``delete_step``) is a function of the
``VolumeRepository`` port and the command, returning the reply's fields; the
handlers run it through ``shared.participant`` on a repository their ``repository``
factory builds on the unit of work's connection (the asyncpg one unless told otherwise).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial

import asyncpg

from shared.envelope import utcnow
from shared.participant import StepRejected, invoke, over, undo
from shared.unit_of_work import UnitOfWork

from . import contracts as c
from .adapters.repository import PgVolumeRepository
from .domain.model import Quota, QuotaExceeded, StoragePolicy, Volume
from .domain.ports import VolumeRepository

RepositoryFactory = Callable[[asyncpg.Connection], VolumeRepository]



async def provision_step(volumes: VolumeRepository, cmd: c.ProvisionVolume, *, policy: StoragePolicy) -> dict:
    """The provision step's effect: the allocation's volume (none for size 0; the existing one, not a second,
    if it has one); returns the reply's fields. Raises StepRejected (nothing created) over the tenant's quota."""
    if cmd.size_gb == 0:
        return {"volume_id": None, "size_gb": 0}
    existing = await volumes.volume_for(cmd.allocation_id)
    if existing is not None:  # provisioned before under another key: the same answer, no second volume
        return {"volume_id": existing.id, "size_gb": existing.size_gb}
    quota = Quota.of(cmd.tenant_id, await volumes.lock_quota(cmd.tenant_id), policy)
    try:
        quota.check(await volumes.used_gb(cmd.tenant_id), cmd.size_gb)
    except QuotaExceeded as exc:
        raise StepRejected(str(exc)) from None
    volume = Volume(uuid.uuid4(), cmd.allocation_id, cmd.tenant_id, cmd.size_gb, utcnow())
    await volumes.add(volume)
    return {"volume_id": volume.id, "size_gb": volume.size_gb}


async def delete_step(volumes: VolumeRepository, cmd: c.DeleteVolume) -> dict:
    """The delete step's effect: the allocation has no volume afterwards (safe when it had none)."""
    await volumes.delete_for(cmd.allocation_id)
    return {}


async def provision_volume(ctx: UnitOfWork, cmd: c.ProvisionVolume, *, policy: StoragePolicy,
                           sim_faults: bool = False, repository: RepositoryFactory = PgVolumeRepository) -> None:
    """Saga step: create the volume (none for size 0), once per key; over quota → failure naming the numbers."""
    await invoke(ctx, cmd, over(repository, partial(provision_step, policy=policy)), step=c.PROVISION_VOLUME,
                 sim_faults=sim_faults)


async def delete_volume(ctx: UnitOfWork, cmd: c.DeleteVolume, *,
                        repository: RepositoryFactory = PgVolumeRepository) -> None:
    """Saga step or compensation: delete the allocation's volume (idempotent; safe if there was none)."""
    await undo(ctx, cmd, over(repository, delete_step), step=c.PROVISION_VOLUME)
