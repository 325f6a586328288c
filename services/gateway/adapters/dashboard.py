"""The dashboard's reads (services/gateway/ui/): the fleet, the operator's counters and charts, and the
allocation and event lists, keyset-paged. Tenant-scoped reads take the tenant and filter by it in SQL; the provider
admin's pass None. Indexes: 0021_dashboard.sql."""
from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from .keyset import Position, newest_first

LIVE = ("PROVISIONING", "ACTIVE", "RELEASING")   # states that hold slots on a node


async def fleet_nodes(conn: asyncpg.Connection, after_name: str | None, limit: int) -> list[asyncpg.Record]:
    """Up to ``limit`` nodes by name after ``after_name``, with free slots, health and how many slots the
    scheduler holds quarantined (its node document's list)."""
    return await conn.fetch(
        "SELECT n.id, n.name, n.gpu_model, n.gpu_count, n.status, n.cordoned, n.pool, "
        "coalesce(c.free_slots, 0) AS free_slots, h.state AS health, coalesce(h.draining, false) AS draining, "
        "jsonb_array_length(n.quarantined) AS quarantined "
        "FROM nodes_view n LEFT JOIN node_capacity_view c ON c.node_id = n.id "
        "LEFT JOIN node_health_view h ON h.node_id = n.id "
        "WHERE $1::text IS NULL OR n.name > $1 ORDER BY n.name LIMIT $2", after_name, limit)


async def live_on_nodes(conn: asyncpg.Connection, node_ids: list[uuid.UUID]) -> list[asyncpg.Record]:
    """The allocations holding slots on these nodes (oldest first: a node's cells fill in that order)."""
    return await conn.fetch(
        "SELECT id, node_id, tenant_id, state, gpu_count FROM allocations_view "
        "WHERE node_id = ANY($1::uuid[]) AND state = ANY($2::text[]) ORDER BY created_at, id", node_ids, list(LIVE))


async def fleet_totals(conn: asyncpg.Connection) -> asyncpg.Record:
    return await conn.fetchrow(
        "SELECT count(*) AS nodes, coalesce(sum(n.gpu_count), 0) AS gpus, "
        "count(*) FILTER (WHERE n.cordoned) AS cordoned, "
        "count(*) FILTER (WHERE h.state IN ('suspect', 'unreachable') OR h.draining) AS unhealthy, "
        "(SELECT coalesce(sum(gpu_count), 0) FROM allocations_view WHERE state = ANY($1::text[]) "
        " AND node_id IS NOT NULL) AS allocated "
        "FROM nodes_view n LEFT JOIN node_health_view h ON h.node_id = n.id", list(LIVE))


async def tenant_names(conn: asyncpg.Connection, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    return {r["id"]: r["name"] for r in await conn.fetch("SELECT id, name FROM tenants WHERE id = ANY($1::uuid[])", ids)}


async def state_counts(conn: asyncpg.Connection, tenant_id: uuid.UUID | None) -> dict[str, int]:
    rows = await conn.fetch("SELECT state, count(*) AS n FROM allocations_view "
                            "WHERE $1::uuid IS NULL OR tenant_id = $1 GROUP BY state", tenant_id)
    return {r["state"]: r["n"] for r in rows}


async def queue_depths(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """Per tenant, its allocations waiting for slots (QUEUED), deepest first."""
    return await conn.fetch(
        "SELECT a.tenant_id, t.name, count(*) AS queued FROM allocations_view a LEFT JOIN tenants t ON t.id = a.tenant_id "
        "WHERE a.state = 'QUEUED' GROUP BY a.tenant_id, t.name ORDER BY queued DESC, a.tenant_id LIMIT 20")


async def latencies(conn: asyncpg.Connection, since: datetime, bucket_s: int) -> list[asyncpg.Record]:
    """Per tenant and time bucket of creation: the mean scheduling latency (created → slots reserved) and the
    mean queue wait (queued → slots reserved, of those that queued), in seconds, over allocations created since
    ``since`` whose slots were reserved."""
    return await conn.fetch(
        "SELECT a.tenant_id, to_timestamp(floor(extract(epoch FROM a.created_at) / $2) * $2) AS bucket, "
        "avg(extract(epoch FROM r.at - a.created_at)) AS scheduling_s, "
        "avg(extract(epoch FROM r.at - q.at)) AS queue_s, count(*) AS n "
        "FROM allocations_view a "
        "CROSS JOIN LATERAL (SELECT min(recorded_at) AS at FROM allocation_events "
        "  WHERE allocation_id = a.id AND type = 'scheduler.slots_reserved') r "
        "LEFT JOIN LATERAL (SELECT min(recorded_at) AS at FROM allocation_events "
        "  WHERE allocation_id = a.id AND type = 'scheduler.reservation_queued') q ON true "
        "WHERE a.created_at >= $1 AND r.at IS NOT NULL GROUP BY 1, 2 ORDER BY 2", since, bucket_s)


async def allocations_page(conn: asyncpg.Connection, tenant_id: uuid.UUID | None, limit: int,
                           after: Position | None) -> list[asyncpg.Record]:
    """Newest first: the tenant's (its page index), or every tenant's (the global one)."""
    cols = "id, tenant_id, name, shape, gpu_count, state, node_id, reason, queue_position, created_at, updated_at"
    if tenant_id is None:
        return await newest_first(conn, f"SELECT {cols} FROM allocations_view WHERE true", [], limit, after)
    return await newest_first(conn, f"SELECT {cols} FROM allocations_view WHERE tenant_id = $1", [tenant_id],
                              limit, after)


async def allocation_events(conn: asyncpg.Connection, allocation_id: uuid.UUID, limit: int) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT seq, type, envelope, recorded_at FROM allocation_events WHERE allocation_id = $1 "
                            "ORDER BY seq LIMIT $2", allocation_id, limit)


async def recent_events(conn: asyncpg.Connection, tenant_id: uuid.UUID | None, before_seq: int | None,
                        limit: int) -> list[asyncpg.Record]:
    """The newest events (before ``before_seq``), the tenant's or every tenant's."""
    return await conn.fetch(
        "SELECT e.seq, e.allocation_id, a.tenant_id, a.name, e.type, e.recorded_at FROM allocation_events e "
        "JOIN allocations_view a ON a.id = e.allocation_id "
        "WHERE ($1::uuid IS NULL OR a.tenant_id = $1) AND ($2::bigint IS NULL OR e.seq < $2) "
        "ORDER BY e.seq DESC LIMIT $3", tenant_id, before_seq, limit)


async def node(conn: asyncpg.Connection, node_id: uuid.UUID) -> asyncpg.Record | None:
    return await conn.fetchrow(
        "SELECT n.*, coalesce(c.free_slots, 0) AS free, h.state AS health, h.since AS health_since, h.alerts, "
        "coalesce(h.draining, false) AS draining, h.cordoned_by, h.last_seen FROM nodes_view n "
        "LEFT JOIN node_capacity_view c ON c.node_id = n.id LEFT JOIN node_health_view h ON h.node_id = n.id "
        "WHERE n.id = $1", node_id)


async def health_history(conn: asyncpg.Connection, node_id: uuid.UUID, limit: int) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT version, state, event, alerts, occurred_at FROM node_health_history "
                            "WHERE node_id = $1 ORDER BY version DESC LIMIT $2", node_id, limit)


async def nodes_changed_since(conn: asyncpg.Connection, since: datetime) -> tuple[bool, datetime]:
    """Whether any node's document, capacity or health changed after ``since``; and the newest change seen."""
    newest = await conn.fetchval(
        "SELECT greatest((SELECT max(changed_at) FROM nodes_view), (SELECT max(changed_at) FROM node_capacity_view), "
        "(SELECT max(changed_at) FROM node_health_view))")
    return (newest is not None and newest > since), (newest or since)
