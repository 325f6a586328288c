"""The GPU models of a pool, which every request for a shape of any model reads with its tenant's quotas, against a
real PostgreSQL with a large pool: one index probe per model, not one index entry per node."""
from __future__ import annotations

import uuid
from pathlib import Path

from services.gateway.adapters import inventory
from services.gateway.domain.scheduling import NIL
from tests.support.pg import fresh_schema, reads_of

GATEWAY_SQL = Path(__file__).resolve().parents[2] / "services" / "gateway" / "schema"


async def test_a_pools_gpu_models_are_read_one_probe_per_model_not_one_entry_per_node(infra, provision):
    """3,000 nodes of three models in the pool (and nodes of another pool, and a node not yet seen, version 0):
    the quota read finds the three models and reads a few dozen entries of nodes_view, not thousands."""
    await provision("gateway")   # the role the gateway's migrations grant to
    async with fresh_schema(provision, "gatewaymodels", GATEWAY_SQL) as conn:
        tenant = uuid.uuid4()
        await conn.execute(
            "INSERT INTO nodes_view (id, name, gpu_model, gpu_count, status, pool, version) SELECT gen_random_uuid(), "
            "'n' || i, (ARRAY['A100', 'H100', 'L40S'])[1 + i % 3], 8, 'registered', CASE WHEN i <= 3000 THEN 'shared' "
            "ELSE 'other' END, 1 FROM generate_series(1, 3300) i")
        await conn.execute("INSERT INTO nodes_view (id, name, gpu_model, gpu_count, status, pool, version) "
                           "VALUES (gen_random_uuid(), 'unseen', 'B200', 8, 'registering', 'shared', 0)")
        await conn.execute("INSERT INTO quotas_view (tenant_id, gpu_model, pool, \"limit\", version) "
                           "VALUES ($1, 'H100', 'shared', 16, 1)", tenant)
        await conn.execute("ANALYZE nodes_view")
        (rows, models), read = await reads_of(
            conn, "nodes_view", lambda: inventory.quota_rows(conn, tenant, "shared", NIL, pool_models=True))
        assert sorted(models) == ["A100", "H100", "L40S"]
        assert [(r.gpu_model, r.limit) for r in rows] == [("H100", 16)]
        assert read <= 50, read
