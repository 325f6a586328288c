"""clusters_view, jobs_view and cluster_idempotency_keys (asyncpg; the caller owns the transaction): the tenant
clusters and jobs the gateway requested and the paas service's documents of them. The clusters slice and the
jobs slice share them (a job names a cluster of its tenant).

Every read is scoped to one tenant: another tenant's cluster or job is never returned (the routes answer 404).
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime

import asyncpg

from shared.db import in_list

from .keyset import newest_first

CLUSTER_COLS = ("id, tenant_id, user_id, name, kind, shape, gpu_count, node_count, pending_node_count, network_id, "
                "pool, priority, state, reason, driver, controller, nodes, autoscaling, spot, version, created_at, "
                "updated_at")
JOB_COLS = ("id, tenant_id, user_id, cluster_id, name, state, reason, exit_code, external_id, tasks, gpus_per_task, "
            "time_limit_s, nodes, cancel_requested_at, version, created_at, started_at, ended_at, updated_at")
ENDED_CLUSTER = ("deleted", "failed")
_ENDED = in_list(ENDED_CLUSTER)   # written in: the partial index clusters_view_live_name (shared.db.in_list)
FINAL_JOB = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT", "REJECTED")


def decoded(row: asyncpg.Record) -> dict:
    """The row as a dict, its jsonb columns decoded."""
    out = dict(row)
    for k in ("nodes", "autoscaling"):
        if isinstance(out.get(k), str):
            out[k] = json.loads(out[k])
    return out


# --- clusters -----------------------------------------------------------------------------------------------

async def lock_tenant_clusters(conn: asyncpg.Connection, tenant_id: uuid.UUID) -> None:
    """Serialise the tenant's cluster creations until commit (a live cluster's name is unique in its tenant)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 17))", f"clusters:{tenant_id}")


async def live_cluster_named(conn: asyncpg.Connection, tenant_id: uuid.UUID, name: str) -> uuid.UUID | None:
    return await conn.fetchval(f"SELECT id FROM clusters_view WHERE tenant_id=$1 AND name=$2 AND state NOT IN {_ENDED} "
                               "LIMIT 1", tenant_id, name)


async def insert_cluster(conn: asyncpg.Connection, c: dict) -> asyncpg.Record:
    """Write the requested cluster (version 0) and return its row."""
    return await conn.fetchrow(
        f"INSERT INTO clusters_view (id, tenant_id, user_id, name, kind, shape, gpu_count, node_count, network_id, "
        f"pool, priority, state, autoscaling, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, "
        f"$10, $11, 'placing', $12::jsonb, $13, $13) RETURNING {CLUSTER_COLS}",
        c["id"], c["tenant_id"], c["user_id"], c["name"], c["kind"], c["shape"], c["gpu_count"], c["node_count"],
        c["network_id"], c["pool"], c["priority"], json.dumps(c["autoscaling"]) if c["autoscaling"] else None,
        c["created_at"])


async def cluster(conn: asyncpg.Connection, cluster_id: uuid.UUID, tenant_id: uuid.UUID, *,
                  for_update: bool = False) -> asyncpg.Record | None:
    """The tenant's cluster, unless it was deleted."""
    lock = " FOR UPDATE" if for_update else ""
    return await conn.fetchrow(f"SELECT {CLUSTER_COLS} FROM clusters_view WHERE id=$1 AND tenant_id=$2 "
                               f"AND state <> 'deleted'{lock}", cluster_id, tenant_id)


async def cluster_page(conn: asyncpg.Connection, tenant_id: uuid.UUID, limit: int,
                       after: tuple[datetime, uuid.UUID] | None) -> list[asyncpg.Record]:
    """Up to ``limit`` of the tenant's clusters (deleted ones left out), newest first, older than ``after``."""
    return await newest_first(conn, f"SELECT {CLUSTER_COLS} FROM clusters_view WHERE tenant_id=$1 "
                                    f"AND state <> 'deleted'", [tenant_id], limit, after)


async def set_cluster(conn: asyncpg.Connection, cluster_id: uuid.UUID, *, state: str | None = None,
                      pending_node_count: int | None = None) -> asyncpg.Record:
    """Mark what the gateway asked for (a state, a pending scale) until the service's next document."""
    return await conn.fetchrow(
        f"UPDATE clusters_view SET state=coalesce($2, state), pending_node_count=coalesce($3, pending_node_count), "
        f"updated_at=now() WHERE id=$1 RETURNING {CLUSTER_COLS}", cluster_id, state, pending_node_count)


async def held_cluster_key(conn: asyncpg.Connection, tenant_id: uuid.UUID, key: str) -> asyncpg.Record | None:
    """The committed cluster creation holding ``key``, if any."""
    return await conn.fetchrow("SELECT request_hash, cluster_id, response FROM cluster_idempotency_keys "
                               "WHERE tenant_id=$1 AND key=$2", tenant_id, key)


async def claim_cluster_key(conn: asyncpg.Connection, tenant_id: uuid.UUID, key: str, request_hash: str,
                            cluster_id: uuid.UUID, response: dict) -> asyncpg.Record | None:
    """Claim ``key``: None when claimed, else the row of the request holding it (the primary key serialises
    concurrent claims; the loser reads the winner's row)."""
    claimed = await conn.fetchval(
        "INSERT INTO cluster_idempotency_keys (tenant_id, key, request_hash, cluster_id, response) "
        "VALUES ($1, $2, $3, $4, $5::jsonb) ON CONFLICT DO NOTHING RETURNING 1",
        tenant_id, key, request_hash, cluster_id, json.dumps(response))
    return None if claimed else await held_cluster_key(conn, tenant_id, key)


# --- jobs ---------------------------------------------------------------------------------------------------

async def insert_job(conn: asyncpg.Connection, j: dict) -> asyncpg.Record:
    """Write the submitted job (version 0, SUBMITTING) and return its row."""
    return await conn.fetchrow(
        f"INSERT INTO jobs_view (id, tenant_id, user_id, cluster_id, name, state, tasks, gpus_per_task, time_limit_s, "
        f"created_at, updated_at) VALUES ($1, $2, $3, $4, $5, 'SUBMITTING', $6, $7, $8, now(), now()) "
        f"RETURNING {JOB_COLS}", j["id"], j["tenant_id"], j["user_id"], j["cluster_id"], j["name"], j["tasks"],
        j["gpus_per_task"], j["time_limit_s"])


async def job(conn: asyncpg.Connection, job_id: uuid.UUID, tenant_id: uuid.UUID, *,
              for_update: bool = False) -> asyncpg.Record | None:
    lock = " FOR UPDATE" if for_update else ""
    return await conn.fetchrow(f"SELECT {JOB_COLS} FROM jobs_view WHERE id=$1 AND tenant_id=$2{lock}", job_id,
                               tenant_id)


async def job_page(conn: asyncpg.Connection, tenant_id: uuid.UUID, cluster_id: uuid.UUID | None, limit: int,
                   after: tuple[datetime, uuid.UUID] | None) -> list[asyncpg.Record]:
    """Up to ``limit`` of the tenant's jobs (of one cluster, when given), newest first, older than ``after``."""
    if cluster_id is None:
        return await newest_first(conn, f"SELECT {JOB_COLS} FROM jobs_view WHERE tenant_id=$1", [tenant_id], limit,
                                  after)
    return await newest_first(conn, f"SELECT {JOB_COLS} FROM jobs_view WHERE tenant_id=$1 AND cluster_id=$2",
                              [tenant_id, cluster_id], limit, after)


async def mark_job_cancelling(conn: asyncpg.Connection, job_id: uuid.UUID) -> asyncpg.Record:
    return await conn.fetchrow(f"UPDATE jobs_view SET cancel_requested_at=now(), updated_at=now() WHERE id=$1 "
                               f"RETURNING {JOB_COLS}", job_id)
