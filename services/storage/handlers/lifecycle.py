"""What the storage handlers share: admitting a volume within its quotas, making and destroying it on its class's
backend, letting clients in and out, and publishing each change.

Not a handler itself. Nothing here commits; ``changed`` queues ``storage.volume_changed`` on the caller's outbox
in its unit of work, so the event and the state it describes commit together.

Backend calls run inside the caller's transaction (they are idempotent per volume id: a unit of work that rolls
back after one is redelivered and repeats it harmlessly). A ``BackendError`` is the storage system's refusal,
shown to the tenant (a volume's ``reason``, a step's failure); anything else (a timeout) is retried.
"""
from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping

import asyncpg

from shared.envelope import utcnow
from shared.refusals import text_safe
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.backends.base import BackendError, StorageBackend, VolumeSpec
from ..domain.model import Refused, StorageClass, StoragePolicy, Volume
from ..domain.ports import VolumeRepository
from ..domain.quota import Limits, Quota

RepositoryFactory = Callable[[asyncpg.Connection], VolumeRepository]
Backends = Mapping[str, StorageBackend]          # storage class name → its backend


def doc(v: Volume) -> c.VolumeDoc:
    """The volume as the tenant sees it (the wire model)."""
    return c.VolumeDoc(volume_id=v.id, tenant_id=v.tenant_id, user_id=v.user_id, name=v.name,
                       storage_class=v.storage_class, backend=v.backend, size_bytes=v.size_bytes,
                       used_bytes=v.used_bytes, shared=v.shared, scratch=v.scratch, state=v.state, reason=v.reason,
                       attachments=[c.Attachment(allocation_id=a.allocation_id, mode=a.mode, node_id=a.node_id,
                                                 state=a.state, reason=a.reason) for a in v.attachments],
                       version=v.version, created_at=v.created_at, updated_at=v.updated_at)


def export(v: Volume, mode: str) -> c.VolumeExport:
    """Where a node mounts the volume from, and how."""
    return c.VolumeExport(volume_id=v.id, name=v.name, mode=mode, backend=v.backend, source=v.export_source or "",
                          options=dict(v.export_options))


async def publish(ctx: UnitOfWork, v: Volume) -> None:
    """Queue the volume as it is (a repeated command's answer: the same version again)."""
    await ctx.emit("storage.volume_changed", c.VolumeChanged(volume=doc(v)), tenant_id=v.tenant_id)


async def changed(ctx: UnitOfWork, volumes: VolumeRepository, v: Volume, *, reason: str | None = None,
                  new: bool = False) -> None:
    """Record a change of ``v`` (its version grows, ``reason`` replaces the last one), store it (``new``: add it)
    and queue ``storage.volume_changed``."""
    v.touch(utcnow(), text_safe(reason, 2000) if reason else None)
    await (volumes.add(v) if new else volumes.save(v))
    await publish(ctx, v)


def spec(v: Volume) -> VolumeSpec:
    return VolumeSpec(v.id, v.tenant_id, v.name, v.size_bytes, v.shared)


def backend_of(backends: Backends, v: Volume, *, made_before: bool = True) -> StorageBackend:
    """The backend of the volume's class, told of the volume when it was ``made_before`` (see
    ``StorageBackend.remember``); Refused when the provider no longer offers the class."""
    backend = backends.get(v.storage_class)
    if backend is None:
        raise Refused(f"storage class {v.storage_class!r} is no longer offered")
    if made_before:
        backend.remember(spec(v))
    return backend


async def admit(volumes: VolumeRepository, policy: StoragePolicy, tenant_id: uuid.UUID, klass: StorageClass,
                user_id: uuid.UUID | None, bytes_: int, count: int) -> None:
    """Lock the tenant's quota in the class, then check that ``bytes_`` and ``count`` more fit the tenant's limits
    and the user's share (if one was set); raises QuotaExceeded. The lock holds until the unit of work ends,
    so the volume added or grown after this call is part of the same decision."""
    own = await volumes.lock_quota(tenant_id, klass.name)
    share = await volumes.user_share(tenant_id, klass.name, user_id) if user_id is not None else None
    quota = Quota.of(klass.name, own, defaults(policy), share)
    user_used = await volumes.usage(tenant_id, klass.name, user_id) if share is not None else None
    quota.check(await volumes.usage(tenant_id, klass.name), bytes_, count, user_used)


def defaults(policy: StoragePolicy) -> Limits:
    return Limits(policy.default_quota_bytes, policy.default_quota_volumes)


async def make(backends: Backends, v: Volume) -> None:
    """Create ``v`` on its backend and record its export; BackendError (nothing of it left there) when the
    storage system refuses."""
    backend = backend_of(backends, v, made_before=False)
    try:
        made = await backend.create(spec(v))
    except BackendError:
        await discard(backend, v.id)
        raise
    v.export_source, v.export_options = made.source, dict(made.options)


async def discard(backend: StorageBackend | None, volume_id: uuid.UUID) -> None:
    """Best effort: nothing of the volume left on ``backend`` (a create that failed, or rolled back before)."""
    if backend is not None:
        with contextlib.suppress(BackendError, TimeoutError):
            await backend.delete(volume_id)


async def destroy(ctx: UnitOfWork, volumes: VolumeRepository, backends: Backends, v: Volume) -> None:
    """Destroy ``v`` (no active attachment left) and its data: deleting → deleted, a tombstone whose name is free
    again; the backend's refusal leaves it in ``error`` with the reason (destroy may be tried again)."""
    v.state, v.attachments = "deleting", []
    try:
        await backend_of(backends, v).delete(v.id)
    except (BackendError, Refused) as exc:
        v.state = "error"
        return await changed(ctx, volumes, v, reason=f"the volume could not be destroyed: {exc}")
    v.state, v.export_source, v.export_options = "deleted", None, {}
    await changed(ctx, volumes, v)


async def release(backends: Backends, v: Volume, allocation_id: uuid.UUID) -> None:
    """Remove the allocation's attachment of ``v`` and take its client off the volume's access list (unless
    another attachment lets the same client in; nothing to take off when the class is no longer offered). Safe
    when there is none."""
    att = v.detach(allocation_id)
    if att is not None and att.client and not v.client_in_use(att.client, besides=allocation_id):
        try:
            backend = backend_of(backends, v)
        except Refused:
            return
        await backend.revoke(v.id, (att.client,))
