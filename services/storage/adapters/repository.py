"""Volumes, attachments and quotas in the storage schema: the asyncpg ``VolumeRepository``, on the unit of work's
connection (the caller owns the transaction)."""
from __future__ import annotations

import json
import uuid

import asyncpg

from ..domain.model import Attachment, Volume
from ..domain.ports import VolumeRepository
from ..domain.quota import Limits, Usage

_COLUMNS = ("id", "tenant_id", "user_id", "name", "storage_class", "backend", "size_bytes", "used_bytes", "shared",
            "scratch", "allocation_id", "state", "reason", "export_source", "export_options", "version",
            "created_at", "updated_at")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM volumes"
_LIVE = "state NOT IN ('deleted', 'rejected')"


def _volume(row: asyncpg.Record, attachments: list[Attachment] | None = None) -> Volume:
    fields = dict(row)
    fields["export_options"] = json.loads(fields["export_options"])
    return Volume(**fields, attachments=attachments or [])


def _values(v: Volume) -> list:
    return [json.dumps(v.export_options) if c == "export_options" else getattr(v, c) for c in _COLUMNS]


class PgVolumeRepository(VolumeRepository):
    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    async def _attachments(self, volume_id: uuid.UUID) -> list[Attachment]:
        rows = await self.conn.fetch("SELECT allocation_id, mode, state, node_id, client, reason FROM attachments "
                                     "WHERE volume_id=$1 ORDER BY created_at, allocation_id", volume_id)
        return [Attachment(**dict(r)) for r in rows]

    async def get(self, volume_id: uuid.UUID, *, for_update: bool = False) -> Volume | None:
        row = await self.conn.fetchrow(f"{_SELECT} WHERE id=$1{' FOR UPDATE' if for_update else ''}", volume_id)
        return _volume(row, await self._attachments(volume_id)) if row else None

    async def claim(self, volume_id: uuid.UUID) -> None:
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))", f"volume:{volume_id}")

    async def scratch_of(self, allocation_id: uuid.UUID) -> Volume | None:
        row = await self.conn.fetchrow(f"{_SELECT} WHERE allocation_id=$1 AND scratch AND {_LIVE} FOR UPDATE",
                                       allocation_id)
        return _volume(row, await self._attachments(row["id"])) if row else None

    async def attached_to(self, allocation_id: uuid.UUID) -> list[uuid.UUID]:
        return [r[0] for r in await self.conn.fetch(
            "SELECT volume_id FROM attachments WHERE allocation_id=$1 ORDER BY volume_id", allocation_id)]

    async def name_taken(self, tenant_id: uuid.UUID, name: str) -> bool:
        return bool(await self.conn.fetchval(f"SELECT true FROM volumes WHERE tenant_id=$1 AND name=$2 AND {_LIVE}",
                                             tenant_id, name))

    async def lock_quota(self, tenant_id: uuid.UUID, storage_class: str) -> Limits:
        # the row is the lock: created on first use, then locked with FOR UPDATE until the transaction ends
        await self.conn.execute("INSERT INTO quotas (tenant_id, storage_class) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                                tenant_id, storage_class)
        row = await self.conn.fetchrow("SELECT max_bytes, max_volumes FROM quotas WHERE tenant_id=$1 AND "
                                       "storage_class=$2 FOR UPDATE", tenant_id, storage_class)
        return Limits(row["max_bytes"], row["max_volumes"])

    async def user_share(self, tenant_id: uuid.UUID, storage_class: str, user_id: uuid.UUID) -> Limits | None:
        row = await self.conn.fetchrow("SELECT max_bytes, max_volumes FROM user_quotas WHERE tenant_id=$1 AND "
                                       "storage_class=$2 AND user_id=$3", tenant_id, storage_class, user_id)
        return Limits(row["max_bytes"], row["max_volumes"]) if row else None

    async def usage(self, tenant_id: uuid.UUID, storage_class: str, user_id: uuid.UUID | None = None) -> Usage:
        row = await self.conn.fetchrow(
            f"SELECT coalesce(sum(size_bytes), 0) AS bytes, count(*) AS volumes FROM volumes WHERE tenant_id=$1 "
            f"AND storage_class=$2 AND {_LIVE} AND ($3::uuid IS NULL OR user_id=$3)", tenant_id, storage_class, user_id)
        return Usage(int(row["bytes"]), int(row["volumes"]))

    async def add(self, volume: Volume) -> None:
        await self.conn.execute(f"INSERT INTO volumes ({', '.join(_COLUMNS)}) VALUES "
                                f"({', '.join(f'${i + 1}' for i in range(len(_COLUMNS)))})", *_values(volume))
        await self._save_attachments(volume)

    async def save(self, volume: Volume) -> None:
        # "id" is the first column: $1 in the WHERE clause, the others $2... in the SET list
        sets = ", ".join(f"{c}=${i + 2}" for i, c in enumerate(_COLUMNS[1:]))
        await self.conn.execute(f"UPDATE volumes SET {sets} WHERE id=$1", *_values(volume))
        await self._save_attachments(volume)

    async def _save_attachments(self, v: Volume) -> None:
        await self.conn.execute("DELETE FROM attachments WHERE volume_id=$1 AND NOT allocation_id = ANY($2::uuid[])",
                                v.id, [a.allocation_id for a in v.attachments])
        if v.attachments:
            await self.conn.executemany(
                "INSERT INTO attachments (volume_id, allocation_id, mode, node_id, state, reason, client) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (volume_id, allocation_id) DO UPDATE SET "
                "mode=EXCLUDED.mode, node_id=EXCLUDED.node_id, state=EXCLUDED.state, reason=EXCLUDED.reason, "
                "client=EXCLUDED.client",
                [(v.id, a.allocation_id, a.mode, a.node_id, a.state, a.reason, a.client) for a in v.attachments])

    async def set_quota(self, tenant_id: uuid.UUID, storage_class: str, user_id: uuid.UUID | None,
                        limits: Limits) -> int:
        if user_id is None:
            return await self.conn.fetchval(
                "INSERT INTO quotas AS q (tenant_id, storage_class, max_bytes, max_volumes, version) "
                "VALUES ($1, $2, $3, $4, 1) ON CONFLICT (tenant_id, storage_class) DO UPDATE SET "
                "max_bytes=EXCLUDED.max_bytes, max_volumes=EXCLUDED.max_volumes, version=q.version + 1 "
                "RETURNING version", tenant_id, storage_class, limits.max_bytes, limits.max_volumes)
        return await self.conn.fetchval(
            "INSERT INTO user_quotas AS q (tenant_id, storage_class, user_id, max_bytes, max_volumes, version) "
            "VALUES ($1, $2, $3, $4, $5, 1) ON CONFLICT (tenant_id, storage_class, user_id) DO UPDATE SET "
            "max_bytes=EXCLUDED.max_bytes, max_volumes=EXCLUDED.max_volumes, version=q.version + 1 "
            "RETURNING version", tenant_id, storage_class, user_id, limits.max_bytes, limits.max_volumes)

    async def live_volumes(self) -> list[Volume]:
        return [_volume(r) for r in await self.conn.fetch(
            f"{_SELECT} WHERE state IN ('available', 'in-use') ORDER BY tenant_id, created_at")]

    async def record_usage(self, used: dict[uuid.UUID, int]) -> None:
        if used:
            await self.conn.execute(
                "UPDATE volumes v SET used_bytes=u.used FROM unnest($1::uuid[], $2::bigint[]) AS u(id, used) "
                "WHERE v.id=u.id", list(used), list(used.values()))
