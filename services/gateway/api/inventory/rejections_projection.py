"""The scheduler's refusals of inventory commands: admin_rejections, and the last refusal shown on its target,
fed by scheduler.admin_command_rejected. The event names the kind of its target (``target_kind``): a node
(nodes_view, by id; a refused registration leaves the node ``rejected``), a shape (shapes_view) or a pool
(pools_view, by name). A quota's or an allocation's refusal is kept in admin_rejections only."""
from __future__ import annotations

import json
import uuid

import asyncpg
import structlog

from services.scheduler import contracts as sc
from shared.unit_of_work import UnitOfWork

log = structlog.get_logger()

# the kind of target of an event sent before the scheduler named it (a uuid target not listed: a node)
_KIND_OF_COMMAND = {"scheduler.define_shape": "shape", "scheduler.define_pool": "pool",
                    "scheduler.set_quota": "quota", "scheduler.cancel_request": "allocation"}
_VIEWS = {"shape": "shapes_view", "pool": "pools_view"}
_SET_LAST = "last_rejection = $2::jsonb || jsonb_build_object('at', now())"


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def target_kind(command: str, target: str, kind: str | None) -> str | None:
    """The kind the event names; for an older event, the one its command implies."""
    if kind is not None:
        return kind
    if command in _KIND_OF_COMMAND:
        return _KIND_OF_COMMAND[command]
    return "node" if _uuid(target) is not None else None


async def record_rejection(conn: asyncpg.Connection, event_id: uuid.UUID, command: str, target: str, reason: str,
                           kind: str | None = None) -> None:
    """Keep the rejection and show it on its target when the view has it. A node still ``registering`` whose
    registration was refused becomes ``rejected``: the scheduler has no such node, nothing will register it."""
    kind = target_kind(command, target, kind)
    await conn.execute("INSERT INTO admin_rejections (event_id, command, target, target_kind, reason) "
                       "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING", event_id, command, target, kind, reason)
    doc = json.dumps({"command": command, "reason": reason, "event_id": str(event_id)})
    if kind == "node":
        node_id = _uuid(target)
        if node_id is None:
            log.warning("projection.rejection_target_unreadable", kind=kind, target=target)
            return
        await conn.execute(
            f"UPDATE nodes_view SET {_SET_LAST}, status = CASE WHEN $3 = 'scheduler.register_node' "
            "AND status = 'registering' AND version = 0 THEN 'rejected' ELSE status END WHERE id=$1",
            node_id, doc, command)
    elif kind in _VIEWS:
        await conn.execute(f"UPDATE {_VIEWS[kind]} SET {_SET_LAST} WHERE name=$1", target, doc)


async def on_admin_command_rejected(ctx: UnitOfWork, data: sc.AdminCommandRejected) -> None:
    log.warning("scheduler.admin_command_rejected", command=data.command, target=data.target,
                target_kind=data.target_kind, reason=data.reason)
    await record_rejection(ctx.conn, ctx.causation.id, data.command, data.target, data.reason, data.target_kind)
