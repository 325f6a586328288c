"""Clusters, their members and jobs in the paas schema (asyncpg, on the caller's connection and transaction)."""
from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from shared.db import in_list

from ..domain.clusters import Cluster, Member

_CLUSTER = ("id", "tenant_id", "user_id", "name", "kind", "shape", "gpu_count", "node_count", "network_id", "pool",
            "tolerations", "priority", "spot", "autoscaling", "state", "reason", "driver", "handle", "version", "created_at",
            "updated_at")
_MEMBER = ("allocation_id", "idx", "gang_id", "state", "node_id", "attachment_id", "address", "reason")
_MEMBER += ("adopted",)     # an allocation the tenant held before the cluster (0005_adopted_members.sql)
_ENDED_MEMBER = ("released", "failed", "returned")
_JSON = ("autoscaling", "handle")
JOB_LIVE = ("SUBMITTING", "PENDING", "RUNNING", "CANCELLING")
# written into the statements: every plan then reads the partial index jobs_live, not every job that ever ran
_LIVE = in_list(JOB_LIVE)


def _cluster(row: asyncpg.Record, members: list[asyncpg.Record]) -> Cluster:
    fields = {k: (json.loads(row[k]) if k in _JSON and row[k] is not None else row[k]) for k in _CLUSTER}
    return Cluster(**fields, members=[Member(**{k: m[k] for k in _MEMBER}) for m in members])


async def followed(conn: asyncpg.Connection, allocation_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Which of the allocations are, or were, a cluster's node or a spot offering's: those whose events the paas
    follows (every allocation's events reach it). One statement, on the caller's connection."""
    rows = await conn.fetch(
        "SELECT a FROM unnest($1::uuid[]) a WHERE EXISTS (SELECT 1 FROM members m WHERE m.allocation_id = a) "
        "OR EXISTS (SELECT 1 FROM spot_nodes s WHERE s.allocation_id = a)", allocation_ids)
    return {r["a"] for r in rows}


class PgClusters:
    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    async def get(self, cluster_id: uuid.UUID, *, lock: bool = False) -> Cluster | None:
        row = await self.conn.fetchrow(f"SELECT {', '.join(_CLUSTER)} FROM clusters WHERE id=$1"
                                       f"{' FOR UPDATE' if lock else ''}", cluster_id)
        if row is None:
            return None
        members = await self.conn.fetch(f"SELECT {', '.join(_MEMBER)} FROM members WHERE cluster_id=$1 ORDER BY idx",
                                        cluster_id)
        return _cluster(row, members)

    async def of_member(self, allocation_id: uuid.UUID) -> Cluster | None:
        """The cluster the allocation is a node of: the live membership, else the newest (an adopted allocation
        returned by one cluster may be a node of another later)."""
        cid = await self.conn.fetchval(
            "SELECT m.cluster_id FROM members m JOIN clusters c ON c.id = m.cluster_id WHERE m.allocation_id=$1 "
            "ORDER BY m.state <> ALL($2::text[]) DESC, c.created_at DESC LIMIT 1", allocation_id, list(_ENDED_MEMBER))
        return await self.get(cid, lock=True) if cid else None

    async def live_memberships(self, allocation_ids: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID]:
        """Allocation → the cluster it is a live node of, for those of ``allocation_ids`` that are one."""
        rows = await self.conn.fetch("SELECT allocation_id, cluster_id FROM members WHERE allocation_id = ANY($1) "
                                     "AND state <> ALL($2::text[])", allocation_ids, list(_ENDED_MEMBER))
        return {r["allocation_id"]: r["cluster_id"] for r in rows}

    async def of_gang(self, gang: uuid.UUID) -> Cluster | None:
        cid = await self.conn.fetchval("SELECT cluster_id FROM members WHERE gang_id=$1 LIMIT 1", gang)
        return await self.get(cid, lock=True) if cid else None

    async def name_taken(self, tenant_id: uuid.UUID, name: str) -> bool:
        return bool(await self.conn.fetchval(
            "SELECT true FROM clusters WHERE tenant_id=$1 AND name=$2 AND state NOT IN ('deleted', 'failed')",
            tenant_id, name))

    async def insert(self, c: Cluster) -> None:
        values = [json.dumps(getattr(c, k)) if k in _JSON and getattr(c, k) is not None else getattr(c, k)
                  for k in _CLUSTER]
        await self.conn.execute(f"INSERT INTO clusters ({', '.join(_CLUSTER)}) VALUES "
                                f"({', '.join(f'${i + 1}' for i in range(len(_CLUSTER)))})", *values)
        await self._members(c)

    async def save(self, c: Cluster) -> None:
        """Write the cluster back with its version grown (the caller holds its row lock) and its members."""
        c.version += 1
        await self.conn.execute(
            "UPDATE clusters SET node_count=$2, autoscaling=$3, state=$4, reason=$5, driver=$6, handle=$7, "
            "version=$8, updated_at=$9 WHERE id=$1", c.id, c.node_count,
            json.dumps(c.autoscaling) if c.autoscaling is not None else None, c.state, c.reason, c.driver,
            json.dumps(c.handle) if c.handle is not None else None, c.version, c.updated_at)
        await self._members(c)

    async def _members(self, c: Cluster) -> None:
        params = ", ".join(f"${i + 2}" for i in range(len(_MEMBER)))
        await self.conn.executemany(
            f"INSERT INTO members (cluster_id, {', '.join(_MEMBER)}) VALUES ($1, {params}) "
            "ON CONFLICT (cluster_id, allocation_id) DO UPDATE SET state=EXCLUDED.state, node_id=EXCLUDED.node_id, "
            "attachment_id=EXCLUDED.attachment_id, address=EXCLUDED.address, reason=EXCLUDED.reason",
            [(c.id, *(getattr(m, k) for k in _MEMBER)) for m in c.members])

    async def working(self) -> list[uuid.UUID]:
        """Clusters the reconciler has work on (starting, scaling, deleting), oldest change first."""
        return [r[0] for r in await self.conn.fetch(
            "SELECT id FROM clusters WHERE state IN ('starting', 'scaling', 'deleting') ORDER BY updated_at")]

    async def autoscaled(self) -> list[uuid.UUID]:
        """Clusters with an autoscaling policy that are up (ready, or in a scale step)."""
        return [r[0] for r in await self.conn.fetch(
            "SELECT id FROM clusters WHERE autoscaling IS NOT NULL AND state IN ('ready', 'scaling')")]

    async def with_handle(self) -> list[uuid.UUID]:
        return [r[0] for r in await self.conn.fetch(
            "SELECT id FROM clusters WHERE handle IS NOT NULL AND state IN ('ready', 'scaling')")]


class PgJobs:
    _COLS = ("id", "tenant_id", "user_id", "cluster_id", "name", "spec", "state", "reason", "exit_code",
             "external_id", "nodes", "version", "submitted_at", "started_at", "ended_at")

    def __init__(self, conn: asyncpg.Connection):
        self.conn = conn

    async def get(self, job_id: uuid.UUID, *, lock: bool = False) -> dict[str, Any] | None:
        row = await self.conn.fetchrow(f"SELECT {', '.join(self._COLS)} FROM jobs WHERE id=$1"
                                       f"{' FOR UPDATE' if lock else ''}", job_id)
        if row is None:
            return None
        job = dict(row)
        job["spec"] = json.loads(job["spec"])
        return job

    async def insert(self, job: dict[str, Any]) -> None:
        await self.conn.execute(
            "INSERT INTO jobs (id, tenant_id, user_id, cluster_id, name, spec, state, reason, submitted_at) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)", job["id"], job["tenant_id"], job["user_id"],
            job["cluster_id"], job["name"], json.dumps(job["spec"]), job["state"], job["reason"],
            job["submitted_at"])

    async def save(self, job: dict[str, Any]) -> None:
        job["version"] += 1
        await self.conn.execute(
            "UPDATE jobs SET state=$2, reason=$3, exit_code=$4, external_id=$5, nodes=$6, version=$7, "
            "started_at=$8, ended_at=$9 WHERE id=$1", job["id"], job["state"], job["reason"], job["exit_code"],
            job["external_id"], list(job["nodes"]), job["version"], job["started_at"], job["ended_at"])

    async def live(self) -> list[uuid.UUID]:
        return [r[0] for r in await self.conn.fetch(
            f"SELECT id FROM jobs WHERE state IN {_LIVE} ORDER BY submitted_at")]

    async def requeued_by_loss(self, cluster_id: uuid.UUID, node: str) -> list[str]:
        """The scheduler ids of the cluster's jobs requeued because ``node`` was lost (``domain.clusters.lost_job``)."""
        return [r[0] for r in await self.conn.fetch(
            "SELECT external_id FROM jobs WHERE cluster_id=$1 AND state='PENDING' AND external_id IS NOT NULL "
            "AND starts_with(reason, $2)", cluster_id, f"requeued: node {node} lost")]

    async def live_of(self, cluster_id: uuid.UUID) -> list[uuid.UUID]:
        return [r[0] for r in await self.conn.fetch(
            f"SELECT id FROM jobs WHERE cluster_id=$1 AND state IN {_LIVE}", cluster_id)]
