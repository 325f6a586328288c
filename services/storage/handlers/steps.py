"""Saga steps: provision the allocation's volumes (its scratch volume, and the tenant's volumes it names), and
delete them (undo: a compensation or the release step).

Provision creates the scratch volume (``size_gb`` > 0) within the tenant's quota in its class and the user's
share, exactly as a create does (the quota locked, then summed), attaches it and each named volume to the
allocation (``attached``: the node-agent's provision_node mounts them) and lets the slot's address in on each
backend; it answers with every export. A refusal (unknown class, over quota, a volume that is not the tenant's
or not available, the backend's refusal) fails the step and leaves nothing behind: the database work is rolled
back by the participant's savepoint, the backend work here (``Made``). A repeat of the step for the same
allocation finds what the first made and answers the same.

Undo removes every attachment of the allocation (its address let out) and destroys its scratch volume; it is
safe when nothing exists.
"""
from __future__ import annotations

import contextlib
import uuid
from functools import partial

from shared.envelope import utcnow
from shared.participant import StepRejected, invoke, over, undo
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.backends.base import BackendError
from ..adapters.repository import PgVolumeRepository
from ..domain.model import GB, Refused, StoragePolicy, Volume, check_size, scratch_id, scratch_name
from ..domain.ports import VolumeRepository
from .lifecycle import Backends, RepositoryFactory, admit, backend_of, changed, destroy, discard, export, make, release


class Made:
    """What a step did on backends, undone (best effort) when the step fails."""

    def __init__(self, backends: Backends):
        self.backends = backends
        self.created: list[Volume] = []
        self.allowed: list[tuple[Volume, str]] = []

    async def undo(self) -> None:
        for v, client in reversed(self.allowed):
            with contextlib.suppress(BackendError, Refused, TimeoutError):
                await backend_of(self.backends, v).revoke(v.id, (client,))
        for v in self.created:
            await discard(self.backends.get(v.storage_class), v.id)


async def _scratch(volumes: VolumeRepository, cmd: c.ProvisionVolume, *, ctx: UnitOfWork, policy: StoragePolicy,
                   made: Made) -> Volume:
    klass = policy.klass(cmd.scratch_class)
    await volumes.lock_quota(cmd.tenant_id, klass.name)     # first: a concurrent try for the allocation waits here
    existing = await volumes.scratch_of(cmd.allocation_id)
    if existing is not None:
        return existing
    size = cmd.size_gb * GB
    check_size(size, klass)
    await admit(volumes, policy, cmd.tenant_id, klass, cmd.user_id, size, 1)
    volume_id = scratch_id(cmd.allocation_id)
    if await volumes.get(volume_id) is not None:
        raise Refused(f"the scratch volume of allocation {cmd.allocation_id} was deleted already")
    name = scratch_name(cmd.allocation_id, await volumes.name_taken(cmd.tenant_id, scratch_name(cmd.allocation_id)))
    now = utcnow()
    v = Volume(volume_id, cmd.tenant_id, name, klass.name, klass.backend, size, "available", now, now,
               user_id=cmd.user_id, scratch=True, allocation_id=cmd.allocation_id)
    made.created.append(v)
    await make(made.backends, v)
    await _attach(v, cmd, "rw", made)
    await changed(ctx, volumes, v, new=True)
    return v


async def _attach(v: Volume, cmd: c.ProvisionVolume, mode: str, made: Made) -> None:
    if cmd.ip_address:
        await backend_of(made.backends, v).allow(v.id, (cmd.ip_address,), read_only=mode == "ro")
        made.allowed.append((v, cmd.ip_address))
    v.attach(cmd.allocation_id, mode, "attached", node_id=cmd.node_id, client=cmd.ip_address)


async def _named(volumes: VolumeRepository, cmd: c.ProvisionVolume, *, ctx: UnitOfWork,
                 made: Made) -> dict[uuid.UUID, tuple[Volume, str]]:
    """Each named volume attached (locked in id order: no deadlock with a step naming them in another order),
    with the mode of its attachment."""
    ids = [ref.volume_id for ref in cmd.volumes]
    if len(set(ids)) != len(ids):
        raise Refused("a volume is named twice")
    attached = {}
    for ref in sorted(cmd.volumes, key=lambda r: r.volume_id):
        v = await volumes.get(ref.volume_id, for_update=True)
        if v is None:
            raise Refused(f"volume {ref.volume_id} not found")
        mine = v.check_attach(cmd.tenant_id, cmd.allocation_id)
        if mine is None:
            await _attach(v, cmd, ref.mode, made)
            await changed(ctx, volumes, v)
        attached[v.id] = (v, mine.mode if mine else ref.mode)
    return attached


async def provision_step(volumes: VolumeRepository, cmd: c.ProvisionVolume, *, ctx: UnitOfWork,
                         policy: StoragePolicy, backends: Backends) -> dict:
    """The step's effect; returns the reply's fields. Raises StepRejected (nothing left behind) when refused."""
    made = Made(backends)
    try:
        scratch = await _scratch(volumes, cmd, ctx=ctx, policy=policy, made=made) if cmd.size_gb > 0 else None
        named = await _named(volumes, cmd, ctx=ctx, made=made)
    except (Refused, BackendError) as exc:
        await made.undo()
        raise StepRejected(str(exc)) from None
    except Exception:
        await made.undo()
        raise
    exports = ([export(scratch, "rw")] if scratch else []) + [export(*named[ref.volume_id]) for ref in cmd.volumes]
    return {"volume_id": scratch.id if scratch else None, "size_gb": scratch.size_bytes // GB if scratch else 0,
            "exports": [e.model_dump(mode="json") for e in exports]}


async def delete_step(volumes: VolumeRepository, cmd: c.DeleteVolume, *, ctx: UnitOfWork, backends: Backends) -> dict:
    """Undo's effect: no attachment of the allocation left, its scratch volume destroyed (safe when none)."""
    for volume_id in await volumes.attached_to(cmd.allocation_id):
        v = await volumes.get(volume_id, for_update=True)
        await release(backends, v, cmd.allocation_id)
        if v.scratch and v.allocation_id == cmd.allocation_id and v.live:
            await destroy(ctx, volumes, backends, v)
        else:
            await changed(ctx, volumes, v)
    scratch = await volumes.scratch_of(cmd.allocation_id)     # one detached before (a live detach)
    if scratch is not None:
        await destroy(ctx, volumes, backends, scratch)
    return {}


async def provision_volume(ctx: UnitOfWork, cmd: c.ProvisionVolume, *, policy: StoragePolicy, backends: Backends,
                           sim_faults: bool = False, repository: RepositoryFactory = PgVolumeRepository) -> None:
    """Saga step: the allocation's scratch volume and named volumes, attached and exported, once per key."""
    step = partial(provision_step, ctx=ctx, policy=policy, backends=backends)
    await invoke(ctx, cmd, over(repository, step), step=c.PROVISION_VOLUME, sim_faults=sim_faults)


async def delete_volume(ctx: UnitOfWork, cmd: c.DeleteVolume, *, backends: Backends,
                        repository: RepositoryFactory = PgVolumeRepository) -> None:
    """Saga step or compensation: detach the allocation's volumes, destroy its scratch volume (idempotent)."""
    await undo(ctx, cmd, over(repository, partial(delete_step, ctx=ctx, backends=backends)), step=c.PROVISION_VOLUME)
