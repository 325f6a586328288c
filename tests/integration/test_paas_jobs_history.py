"""The paas' reads of live jobs against a real PostgreSQL with a long history: the reconciler lists them four
times a second, so what it reads must not grow with the jobs that ended."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

from services.paas.adapters.repository import PgJobs
from tests.support.pg import fresh_schema, reads_of

PAAS_SQL = Path(__file__).resolve().parents[2] / "services" / "paas" / "schema"


async def test_the_live_jobs_are_read_from_their_index_whatever_the_jobs_that_ended(infra, provision):
    """3,000 ended jobs and one running: listing the live jobs (all, and one cluster's) reads a handful of rows
    and index entries under the generic plan a prepared statement runs from its sixth execution on, and finds the
    running job. With the states passed as a parameter that plan could not use the partial index jobs_live."""
    async with fresh_schema(provision, "paashistory", PAAS_SQL) as conn:
        cluster, tenant, user = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        await conn.execute("INSERT INTO clusters (id, tenant_id, user_id, name, kind, shape, gpu_count, node_count, state) "
                           "VALUES ($1, $2, $3, 'c', 'slurm', 'vm.1gpu', 1, 1, 'ready')", cluster, tenant, user)
        await conn.execute(
            "INSERT INTO jobs (id, tenant_id, user_id, cluster_id, name, spec, state) SELECT gen_random_uuid(), $1, $2, "
            "$3, 'j' || i, '{}', 'SUCCEEDED' FROM generate_series(1, 3000) i", tenant, user, cluster)
        running = uuid.uuid4()
        await conn.execute("INSERT INTO jobs (id, tenant_id, user_id, cluster_id, name, spec, state) "
                           "VALUES ($1, $2, $3, $4, 'live', $5, 'RUNNING')", running, tenant, user, cluster, json.dumps({}))
        await conn.execute("ANALYZE jobs")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        jobs, reads = PgJobs(conn), {}
        for name, call in [("live", jobs.live), ("live_of", lambda: jobs.live_of(cluster))]:
            found, reads[name] = await reads_of(conn, "jobs", call)
            assert found == [running]
        assert all(n <= 20 for n in reads.values()), reads
