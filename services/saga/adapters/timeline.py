"""An allocation's sagas with their step records, read in one statement (``saga.read_steps``): the sagas by
the (allocation_id, kind, attempt) key's index, each one's records by its primary key. Reads only, no lock."""
from __future__ import annotations

import json
import uuid
from datetime import datetime

import asyncpg

_READ = (
    "SELECT s.id AS saga_id, s.kind, s.status AS state, s.created_at AS started_at, s.finished_at, "
    "coalesce((SELECT json_agg(json_build_object('step', st.step, 'phase', st.phase, 'status', st.status, "
    "'attempt', st.attempt, 'started_at', st.started_at, 'finished_at', st.finished_at, 'error', st.error)) "
    "FROM saga_steps st WHERE st.saga_id = s.id), '[]') AS records "
    "FROM sagas s WHERE s.allocation_id = $1 ORDER BY s.created_at, s.kind, s.attempt")


def _instant(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


async def read(conn: asyncpg.Connection, allocation_id: uuid.UUID) -> list[tuple[dict, list[dict]]]:
    """Every saga of the allocation, oldest first: (saga_id, kind, state, started_at, finished_at) and its step
    records (step, phase, status, attempt, started_at, finished_at, error), unordered."""
    out = []
    for row in await conn.fetch(_READ, allocation_id):
        records = [{**r, "started_at": _instant(r["started_at"]), "finished_at": _instant(r["finished_at"])}
                   for r in json.loads(row["records"])]
        out.append(({k: row[k] for k in ("saga_id", "kind", "state", "started_at", "finished_at")}, records))
    return out
