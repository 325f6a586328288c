"""The scheduler's refusals of inventory commands: admin_rejections, and the last refusal shown on its target
(nodes_view, shapes_view or pools_view), fed by scheduler.admin_command_rejected."""
from __future__ import annotations

import json
import uuid

import asyncpg
import structlog

from services.scheduler import contracts as sc
from shared.unit_of_work import UnitOfWork

log = structlog.get_logger()


async def record_rejection(conn: asyncpg.Connection, event_id: uuid.UUID, command: str, target: str, reason: str) -> None:
    """Keep the rejection and show it on its target (a node id, a shape or a pool name) when one matches."""
    await conn.execute("INSERT INTO admin_rejections (event_id, command, target, reason) VALUES ($1, $2, $3, $4) "
                       "ON CONFLICT DO NOTHING", event_id, command, target, reason)
    doc = json.dumps({"command": command, "reason": reason, "event_id": str(event_id)})
    try:
        node_id = uuid.UUID(target)
    except ValueError:
        node_id = None
    if node_id is not None:
        await conn.execute("UPDATE nodes_view SET last_rejection = $2::jsonb || jsonb_build_object('at', now()) "
                           "WHERE id=$1", node_id, doc)
        return
    for table in ("shapes_view", "pools_view"):
        await conn.execute(f"UPDATE {table} SET last_rejection = $2::jsonb || jsonb_build_object('at', now()) "
                           "WHERE name=$1", target, doc)


async def on_admin_command_rejected(ctx: UnitOfWork, data: sc.AdminCommandRejected) -> None:
    log.warning("scheduler.admin_command_rejected", command=data.command, target=data.target, reason=data.reason)
    await record_rejection(ctx.conn, ctx.causation.id, data.command, data.target, data.reason)
