"""Tenant volumes as the storage service publishes them: volumes_view, volume_quotas_view and
storage_classes_view, fed by storage.* events (each in the consumer's transaction, inbox-deduped).

Events arrive on separate consumers, in any order: a volume document or a quota is applied only when its
``version`` is higher than the one shown; the classes only when announced later than the ones shown; a usage
report only when taken later than the last one applied. A document replaces what the gateway marked while it
waited (a pending resize, an 'attaching' or 'detaching' attachment): it is the service's answer, or newer.
The row the POST wrote keeps its creation time (a page cursor stays where it was).
"""
from __future__ import annotations

import json

from services.storage import contracts as stc
from shared.unit_of_work import UnitOfWork

from ...adapters.versioned import upsert_newer
from ...domain.scheduling import NIL

# a usage figure the document lacks keeps the last one reported; the document answers a pending resize
_VOLUME = upsert_newer(
    "volumes_view", ["id"], ["id", "tenant_id", "user_id", "name", "storage_class", "backend", "size_bytes",
                             "used_bytes", "shared", "scratch", "state", "reason", "attachments", "version",
                             "created_at", "updated_at"],
    jsonb={"attachments"}, same=["tenant_id"], insert_only={"created_at"},
    assign={"used_bytes": "coalesce(EXCLUDED.used_bytes, volumes_view.used_bytes)", "pending_size_bytes": "NULL"})
_QUOTA = upsert_newer("volume_quotas_view", ["tenant_id", "storage_class", "user_id"],
                      ["tenant_id", "storage_class", "user_id", "max_bytes", "max_volumes", "effective_max_bytes",
                       "effective_max_volumes", "version"], assign={"changed_at": "now()"})


async def on_volume_changed(ctx: UnitOfWork, data: stc.VolumeChanged) -> None:
    v = data.volume
    attachments = json.dumps([a.model_dump(mode="json") for a in v.attachments])
    await ctx.conn.execute(_VOLUME, v.volume_id, v.tenant_id, v.user_id, v.name, v.storage_class, v.backend, v.size_bytes,
                           v.used_bytes, v.shared, v.scratch, v.state, v.reason, attachments, v.version, v.created_at,
                           v.updated_at)


async def on_quota_changed(ctx: UnitOfWork, data: stc.QuotaChanged) -> None:
    await ctx.conn.execute(_QUOTA, data.tenant_id, data.storage_class, data.user_id or NIL, data.max_bytes,
                           data.max_volumes, data.effective_max_bytes, data.effective_max_volumes, data.version)


async def on_classes_announced(ctx: UnitOfWork, data: stc.ClassesAnnounced) -> None:
    """The latest announcement wins (by when the service announced it)."""
    classes = json.dumps([c.model_dump(mode="json") for c in data.classes])
    await ctx.conn.execute(
        "INSERT INTO storage_classes_view (id, classes, default_quota_bytes, default_quota_volumes, announced_at) "
        "VALUES (1, $1::jsonb, $2, $3, $4) ON CONFLICT (id) DO UPDATE SET classes=EXCLUDED.classes, "
        "default_quota_bytes=EXCLUDED.default_quota_bytes, default_quota_volumes=EXCLUDED.default_quota_volumes, "
        "announced_at=EXCLUDED.announced_at WHERE storage_classes_view.announced_at < EXCLUDED.announced_at",
        classes, data.default_quota_bytes, data.default_quota_volumes, ctx.causation.occurred_at)


async def on_usage_reported(ctx: UnitOfWork, data: stc.UsageReported) -> None:
    """Each volume of the report shows what its storage system counts (a volume of another tenant is not touched)."""
    if not data.volumes:
        return
    await ctx.conn.execute(
        "UPDATE volumes_view v SET used_bytes=u.used_bytes, usage_at=$4 FROM unnest($2::uuid[], $3::bigint[]) "
        "AS u(volume_id, used_bytes) WHERE v.id=u.volume_id AND v.tenant_id=$1 AND (v.usage_at IS NULL OR v.usage_at < $4)",
        data.tenant_id, [u.volume_id for u in data.volumes], [u.used_bytes for u in data.volumes], data.at)
