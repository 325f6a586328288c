"""Tenant commands on volumes and quotas: create, resize, destroy, set a quota.

Each answers with ``storage.volume_changed`` (the whole volume, its version grown) or, for a quota,
``storage.quota_changed``. A request no retry can fix is refused on the volume: a create becomes a ``rejected``
volume with the reason, a refused resize or destroy leaves the volume as it was with ``reason`` set. A repeated
command (same volume id, same size) is answered with the volume as it is.

A command naming a volume that is not the tenant's raises PermanentError ("not found"): nothing is said about
another tenant's volume; ``refused`` (the subscriptions' ``on_refused``) then only logs it.
"""
from __future__ import annotations

import structlog

from shared.envelope import utcnow
from shared.refusals import PermanentError
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.backends.base import BackendError
from ..adapters.repository import PgVolumeRepository
from ..domain.model import Refused, StoragePolicy, Volume, check_size
from ..domain.quota import Limits, effective
from .lifecycle import Backends, RepositoryFactory, admit, backend_of, changed, defaults, destroy, discard, make, publish

log = structlog.get_logger()


async def create_volume(ctx: UnitOfWork, cmd: c.CreateVolume, *, policy: StoragePolicy, backends: Backends,
                        repository: RepositoryFactory = PgVolumeRepository) -> None:
    """Create the volume within the tenant's quota in its class (and the user's share): ``available``, or
    ``rejected`` with the reason (unknown class, too large, over quota, name taken, the backend's refusal;
    nothing of it is left on the backend). Idempotent on the volume id."""
    volumes = repository(ctx.conn)
    await volumes.claim(cmd.volume_id)
    existing = await volumes.get(cmd.volume_id, for_update=True)
    if existing is not None:
        if existing.tenant_id != cmd.tenant_id:
            raise PermanentError(f"volume id {cmd.volume_id} is in use; choose another")
        return await publish(ctx, existing)
    now = utcnow()
    v = Volume(cmd.volume_id, cmd.tenant_id, cmd.name, cmd.storage_class, "", cmd.size_bytes, "creating", now, now,
               user_id=cmd.user_id, shared=cmd.shared)
    try:
        klass = policy.klass(cmd.storage_class)
        v.backend = klass.backend
        check_size(cmd.size_bytes, klass)
        await admit(volumes, policy, cmd.tenant_id, klass, cmd.user_id, cmd.size_bytes, 1)
        if await volumes.name_taken(cmd.tenant_id, cmd.name):
            raise Refused(f"a volume named {cmd.name!r} exists already")
        await make(backends, v)
    except (Refused, BackendError) as exc:
        if v.backend:   # a try that rolled back after its backend call may have left the volume there (the id is
            await discard(backends.get(v.storage_class), v.id)      # claimed and unused: nothing else has it)
        v.state = "rejected"
        return await changed(ctx, volumes, v, reason=str(exc), new=True)
    v.state = "available"
    await changed(ctx, volumes, v, new=True)


async def _owned(volumes, volume_id, tenant_id, *, for_update: bool = True) -> Volume:
    v = await volumes.get(volume_id, for_update=for_update)
    if v is None or v.tenant_id != tenant_id:
        raise PermanentError(f"volume {volume_id} not found")
    return v


async def resize_volume(ctx: UnitOfWork, cmd: c.ResizeVolume, *, policy: StoragePolicy, backends: Backends,
                        repository: RepositoryFactory = PgVolumeRepository) -> None:
    """Grow the volume within quota (the growth is checked, under the quota's lock); refused (shrink, too
    large, over quota, the backend's refusal) → the size stays, ``reason`` says why."""
    volumes = repository(ctx.conn)
    v = await _owned(volumes, cmd.volume_id, cmd.tenant_id, for_update=False)
    if v.live:   # locks in order: the quota, then the volume
        await volumes.lock_quota(v.tenant_id, v.storage_class)
    v = await _owned(volumes, cmd.volume_id, cmd.tenant_id)
    try:
        if not v.check_resize(cmd.size_bytes, policy.klass(v.storage_class)):
            return await publish(ctx, v)
        await admit(volumes, policy, v.tenant_id, policy.klass(v.storage_class), v.user_id,
                    cmd.size_bytes - v.size_bytes, 0)
        await backend_of(backends, v).resize(v.id, cmd.size_bytes)
    except (Refused, BackendError) as exc:
        return await changed(ctx, volumes, v, reason=str(exc))
    v.size_bytes = cmd.size_bytes
    await changed(ctx, volumes, v)


async def destroy_volume(ctx: UnitOfWork, cmd: c.DestroyVolume, *, backends: Backends,
                         repository: RepositoryFactory = PgVolumeRepository) -> None:
    """Destroy the volume and its data (a tombstone ``deleted`` stays); refused while it is attached. Destroying
    a deleted or rejected volume again changes nothing."""
    volumes = repository(ctx.conn)
    v = await _owned(volumes, cmd.volume_id, cmd.tenant_id)
    if not v.live:
        return await publish(ctx, v)
    try:
        v.check_destroy()
    except Refused as exc:
        return await changed(ctx, volumes, v, reason=exc.reason)
    await destroy(ctx, volumes, backends, v)


async def set_quota(ctx: UnitOfWork, cmd: c.SetStorageQuota, *, policy: StoragePolicy,
                    repository: RepositoryFactory = PgVolumeRepository) -> None:
    """Set the tenant's limits in a class (user_id None) or a user's share; publish the limits that apply."""
    volumes = repository(ctx.conn)
    tenant = await volumes.lock_quota(cmd.tenant_id, cmd.storage_class)
    limits = Limits(cmd.max_bytes, cmd.max_volumes)
    version = await volumes.set_quota(cmd.tenant_id, cmd.storage_class, cmd.user_id, limits)
    tenant_limits = effective(limits if cmd.user_id is None else tenant, defaults(policy))
    max_bytes, max_volumes = tenant_limits if cmd.user_id is None else effective(limits, Limits(*tenant_limits))
    await ctx.emit("storage.quota_changed", c.QuotaChanged(
        tenant_id=cmd.tenant_id, storage_class=cmd.storage_class, user_id=cmd.user_id, max_bytes=cmd.max_bytes,
        max_volumes=cmd.max_volumes, effective_max_bytes=max_bytes, effective_max_volumes=max_volumes,
        version=version), tenant_id=cmd.tenant_id)


async def refused(ctx: UnitOfWork, cmd, reason: str, *, repository: RepositoryFactory = PgVolumeRepository) -> None:
    """The ``on_refused`` of the volume commands: a command no retry can fix (its handler's work rolled back)
    shows its reason on the volume when that is the tenant's; a create of an unused id is stored ``rejected``.
    Anything else (another tenant's volume, an unknown one) is only logged."""
    volumes = repository(ctx.conn)
    if isinstance(cmd, c.CreateVolume):
        await volumes.claim(cmd.volume_id)
    v = await volumes.get(cmd.volume_id, for_update=True)
    if v is not None and v.tenant_id == cmd.tenant_id:
        return await changed(ctx, volumes, v, reason=reason)
    if v is None and isinstance(cmd, c.CreateVolume):
        now = utcnow()
        return await changed(ctx, volumes, Volume(cmd.volume_id, cmd.tenant_id, cmd.name, cmd.storage_class, "",
                                                  cmd.size_bytes, "rejected", now, now, user_id=cmd.user_id,
                                                  shared=cmd.shared), reason=reason, new=True)
    log.warning("storage.command_refused", volume_id=str(cmd.volume_id), tenant_id=str(cmd.tenant_id), reason=reason)
