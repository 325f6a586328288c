"""instance_actions and the instance columns of allocations_view (asyncpg; the caller owns the transaction).

An action row is the audit record of a tenant's power action: who asked what of which allocation on which
node, and what came of it (``power_projection`` records the node's answer; the sweep,
``entrypoints.loops``, fails an action no node answered by its deadline plus a grace).
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime

import asyncpg

from ...adapters.keyset import newest_first

_COLS = ("id, allocation_id, tenant_id, user_id, node_id, action, state, reason, power_state, requested_at, "
         "finished_at, expires_at")


async def insert_action(conn: asyncpg.Connection, action_id: uuid.UUID, allocation_id: uuid.UUID,
                        tenant_id: uuid.UUID, user_id: uuid.UUID, node_id: uuid.UUID, action: str,
                        expires_at: datetime) -> asyncpg.Record:
    return await conn.fetchrow(
        f"INSERT INTO instance_actions (id, allocation_id, tenant_id, user_id, node_id, action, expires_at) "
        f"VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {_COLS}", action_id, allocation_id, tenant_id, user_id,
        node_id, action, expires_at)


async def get_action(conn: asyncpg.Connection, action_id: uuid.UUID, allocation_id: uuid.UUID) -> asyncpg.Record | None:
    return await conn.fetchrow(f"SELECT {_COLS} FROM instance_actions WHERE id=$1 AND allocation_id=$2",
                               action_id, allocation_id)


async def actions_page(conn: asyncpg.Connection, allocation_id: uuid.UUID, limit: int,
                       after: tuple[datetime, uuid.UUID] | None) -> list[asyncpg.Record]:
    """Up to ``limit`` actions of the allocation, newest first, strictly older than the ``after`` position."""
    return await newest_first(conn, f"SELECT {_COLS} FROM instance_actions WHERE allocation_id=$1", [allocation_id],
                              limit, after, time="requested_at")


async def finish_action(conn: asyncpg.Connection, action_id: uuid.UUID, allocation_id: uuid.UUID, *, ok: bool,
                        reason: str | None, late_reason: str, power_state: str, at: datetime) -> str | None:
    """Record the node's answer, once (a redelivered answer changes nothing): ``"answered"`` for a pending
    action; ``"late"`` for one the sweep failed before the answer came: the answer wins (the node did what it
    says), its reason becoming ``late_reason`` followed by the sweep's; None for no such action or one answered
    already. Every answer sets power_state and the sweep never does: that is what makes a late one once only."""
    return await conn.fetchval(
        "UPDATE instance_actions SET state=$3, power_state=$5, finished_at=$6, "
        "reason = CASE WHEN expired_at IS NULL THEN $4 ELSE left($7 || ' (' || reason || ')', 2000) END "
        "WHERE id=$1 AND allocation_id=$2 AND (state='pending' OR (expired_at IS NOT NULL AND power_state IS NULL)) "
        "RETURNING CASE WHEN expired_at IS NULL THEN 'answered' ELSE 'late' END",
        action_id, allocation_id, "succeeded" if ok else "failed", reason, power_state, at, late_reason)


async def overdue_actions(conn: asyncpg.Connection, grace_s: float, limit: int) -> list[asyncpg.Record]:
    """Pending actions whose deadline passed more than ``grace_s`` ago, oldest deadline first (no lock taken)."""
    return await conn.fetch(f"SELECT {_COLS} FROM instance_actions WHERE state='pending' "
                            "AND expires_at < now() - make_interval(secs => $1) ORDER BY expires_at LIMIT $2",
                            grace_s, limit)


async def expire_action(conn: asyncpg.Connection, action_id: uuid.UUID, grace_s: float,
                        reason: str) -> asyncpg.Record | None:
    """Fail the action for want of an answer, if it is still pending and overdue (whichever gateway replica
    comes first does it; the others, and a node's answer committed meanwhile, leave it alone)."""
    return await conn.fetchrow(
        "UPDATE instance_actions SET state='failed', reason=$2, expired_at=now(), finished_at=now() "
        "WHERE id=$1 AND state='pending' AND expires_at < now() - make_interval(secs => $3) "
        f"RETURNING {_COLS}", action_id, reason, grace_s)


async def set_instance(conn: asyncpg.Connection, allocation_id: uuid.UUID, instance: dict) -> None:
    await conn.execute("UPDATE allocations_view SET instance=$2::jsonb, updated_at=now() WHERE id=$1",
                       allocation_id, json.dumps(instance))


async def set_power_state(conn: asyncpg.Connection, allocation_id: uuid.UUID, power_state: str, at: datetime) -> bool:
    """Show ``power_state`` on the allocation's instance, unless a later change was shown already."""
    return await conn.fetchval(
        "UPDATE allocations_view SET instance = jsonb_set(instance, '{power_state}', to_jsonb($2::text)), "
        "power_changed_at=$3, updated_at=now() WHERE id=$1 AND instance IS NOT NULL "
        "AND (power_changed_at IS NULL OR power_changed_at < $3) RETURNING 1", allocation_id, power_state,
        at) is not None


async def set_network_phase(conn: asyncpg.Connection, allocation_id: uuid.UUID, phase: str, seconds: float) -> bool:
    """Show the network a bare-metal server's port is on; its move back to the provisioning network (for the
    wipe) is one of its phases, ``port_to_provisioning`` (the move to the tenant network is already one)."""
    return await conn.fetchval(
        "UPDATE allocations_view SET instance = jsonb_set(instance, '{network_phase}', to_jsonb($2::text)) || "
        "CASE WHEN $2 = 'cleaning' THEN jsonb_build_object('phases', COALESCE(instance->'phases', '[]'::jsonb) || "
        "jsonb_build_array(jsonb_build_object('name', 'port_to_provisioning', 'seconds', $3::float8))) "
        "ELSE '{}'::jsonb END, updated_at=now() WHERE id=$1 AND instance IS NOT NULL RETURNING 1",
        allocation_id, phase, seconds) is not None
