"""`python -m tests.bench.saga_history` — not a test. What the coordinator's most frequent reads cost once many
sagas have ended: ``--sagas`` finished allocate sagas (a tenth of them one tenant's) and one running, then the
start's read of the tenant's line (``lines.read``, once per allocation) and the deadline loop's look
(``repository.due``, five times a second), each timed over ``--repeat`` calls under both of PostgreSQL's plans:
``auto`` (what a prepared statement gets) and ``force_generic_plan`` (what it may get from its sixth execution
on). The baseline, in the same run: a lookup of one saga by its primary key. The last line is one JSON object."""
from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from services.saga.adapters import lines, repository
from services.saga.domain.model import Saga, StepRecord
from shared.db import migrate
from tests.bench.common import report, work_dir
from tooling.embedded import EmbeddedPostgres

SAGA_SQL = Path(repository.__file__).resolve().parents[1] / "schema"


async def timed(call, repeat: int) -> float:
    """Milliseconds per call, after one call that prepares it."""
    await call()
    t0 = time.perf_counter()
    for _ in range(repeat):
        await call()
    return round((time.perf_counter() - t0) / repeat * 1000, 3)


async def main(sagas: int, repeat: int) -> dict:
    pg = EmbeddedPostgres(work_dir("tessera-saga-history-") / "pg", durable=False).start()
    try:
        conn = await asyncpg.connect(pg.admin_dsn, server_settings={"search_path": "saga"})
        await conn.execute("CREATE SCHEMA saga")
        await migrate(conn, "saga", SAGA_SQL)
        tenant = uuid.uuid4()
        await conn.execute(
            "INSERT INTO sagas (id, kind, allocation_id, tenant_id, status, input) SELECT gen_random_uuid(), "
            "'allocate', gen_random_uuid(), CASE WHEN i % 10 = 0 THEN $1 ELSE gen_random_uuid() END, 'completed', "
            "'{}' FROM generate_series(1, $2) i", tenant, sagas)
        saga = Saga(uuid.uuid4(), "allocate", uuid.uuid4(), tenant, {"gpu_count": 1})
        await repository.create(conn, saga)
        await repository.save(conn, saga, replace(saga, status="running", steps={
            ("reserve_slots", "invoke"): StepRecord("invoked", deadline=datetime.now(UTC) + timedelta(minutes=5))}))
        await conn.execute("VACUUM ANALYZE sagas")
        out: dict = {"sagas": sagas, "repeat": repeat}
        for mode, key in (("auto", "auto"), ("force_generic_plan", "generic")):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            out[f"baseline_pk_lookup_ms_{key}"] = await timed(
                lambda: conn.fetchval("SELECT status FROM sagas WHERE id=$1", saga.id), repeat)
            out[f"line_read_ms_{key}"] = await timed(lambda: lines.read(conn, tenant, uuid.uuid4(), 64), repeat)
            out[f"deadline_look_ms_{key}"] = await timed(lambda: repository.due(conn, 64), repeat)
            for name in ("line_read", "deadline_look"):
                out[f"{name}_ratio_{key}"] = round(out[f"{name}_ms_{key}"] / out[f"baseline_pk_lookup_ms_{key}"], 1)
        await conn.close()
        return out
    finally:
        pg.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--sagas", type=int, default=200_000, help="finished allocate sagas")
    ap.add_argument("--repeat", type=int, default=50, help="calls timed of each")
    args = ap.parse_args()
    report(asyncio.run(main(args.sagas, args.repeat)))
