"""What the service says on its own, not in answer to a message: the storage classes it offers (once, on start)
and what the tenants' volumes use (every TESSERA_STORAGE_USAGE_INTERVAL_S).

entrypoints/loops.py runs both (the usage report on the leader only), each unit of work opened with ``begin`` (no
causing message: each names its own correlation id) and published through the outbox.

The usage report reads ``usage`` from each live volume's backend outside any transaction (btrfs commits once
per read for current numbers: a few ms), then stores ``used_bytes`` on the volumes (no version change: usage is
not a change of the volume) and publishes one ``storage.usage_reported`` per tenant with a live volume. A
volume whose backend fails is left out of that report and logged; the others are reported.
"""
from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import structlog

from shared.envelope import utcnow
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.backends.base import BackendError
from ..adapters.repository import PgVolumeRepository
from ..domain.model import Refused, StoragePolicy
from .lifecycle import Backends, RepositoryFactory, backend_of

log = structlog.get_logger()
Begin = Callable[[], AbstractAsyncContextManager[UnitOfWork]]


async def announce_classes(begin: Begin, policy: StoragePolicy) -> None:
    """Publish the classes on offer and the default quotas (``storage.classes_announced``), once."""
    classes = [c.StorageClass(name=k.name, backend=k.backend, description=k.description,
                              max_volume_bytes=k.max_volume_bytes, default=k.default, simulated=k.simulated)
               for k in policy.classes]
    async with begin() as ctx:
        await ctx.emit("storage.classes_announced", c.ClassesAnnounced(
            classes=classes, default_quota_bytes=policy.default_quota_bytes,
            default_quota_volumes=policy.default_quota_volumes), correlation_id=f"storage-classes-{uuid.uuid4()}")


async def report_usage(begin: Begin, backends: Backends, *,
                       repository: RepositoryFactory = PgVolumeRepository) -> int:
    """One usage report: read, store and publish what every live volume uses; returns how many were read."""
    async with begin() as ctx:
        live = await repository(ctx.conn).live_volumes()
    used: dict[uuid.UUID, int] = {}
    by_tenant: dict[uuid.UUID, list[c.VolumeUsage]] = defaultdict(list)
    for v in live:
        try:
            usage = await backend_of(backends, v).usage(v.id)
        except (BackendError, Refused, TimeoutError) as exc:
            log.warning("storage.usage_unreadable", volume_id=str(v.id), storage_class=v.storage_class, error=str(exc))
            continue
        used[v.id] = usage.used_bytes
        by_tenant[v.tenant_id].append(c.VolumeUsage(volume_id=v.id, used_bytes=usage.used_bytes,
                                                    limit_bytes=usage.limit_bytes))
    at, correlation = utcnow(), f"storage-usage-{uuid.uuid4()}"
    async with begin() as ctx:
        await repository(ctx.conn).record_usage(used)
        for tenant_id, volumes in by_tenant.items():
            await ctx.emit("storage.usage_reported", c.UsageReported(tenant_id=tenant_id, volumes=volumes, at=at),
                           correlation_id=correlation, tenant_id=tenant_id)
    return len(used)
