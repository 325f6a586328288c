"""What every scheduler handler shares: admin rejections without partial state, and node documents."""
from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import structlog

from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters import nodes

log = structlog.get_logger()


class Rejected(Exception):
    """An admin command that cannot apply (unknown node, stale proposal, bad topology...): it is answered
    with ``scheduler.admin_command_rejected`` and acknowledged, never retried, and changes nothing."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


async def admin(ctx: UnitOfWork, command: str, target: str, body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` in a savepoint; a ``Rejected`` rolls back everything it wrote and emits the rejection."""
    try:
        async with ctx.conn.transaction():
            await body()
    except Rejected as rej:
        log.warning("scheduler.admin_command_rejected", command=command, target=target, reason=rej.reason)
        await ctx.emit("scheduler.admin_command_rejected",
                       c.AdminCommandRejected(command=command, target=target, reason=rej.reason))


async def emit_node(ctx: UnitOfWork, node_id: uuid.UUID) -> dict:
    """Emit ``scheduler.node_changed`` with the node's whole committed-to-be document; returns it."""
    doc = await nodes.document(ctx.conn, node_id)
    await ctx.emit("scheduler.node_changed", c.NodeChanged(**doc))
    return doc
