"""What every scheduler handler shares: admin rejections without partial state, and node documents.

An admin command is refused in one of two ways, both answered with ``scheduler.admin_command_rejected``
(naming the command, its target and the target's kind) and acknowledged, never retried:
- ``Rejected``: the scheduler decides it cannot apply (``admin`` rolls back what the command wrote);
- an error no retry can fix (``shared.refusals.permanent``: data PostgreSQL refuses, an unknown
  reference): the kit rolls the handler back and calls ``refused``, the subscription's ``on_refused``.
"""
from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Self

import structlog

from shared.refusals import Refusal, text_safe
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..domain.ports import Row, SchedulerRepository
from .active import ActiveScheduler

log = structlog.get_logger()


class Rejected(Exception):
    """An admin command that cannot apply (unknown node, stale proposal, bad topology...): it is answered
    with ``scheduler.admin_command_rejected`` and acknowledged, never retried, and changes nothing."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


async def known_node(store: SchedulerRepository, node_id: uuid.UUID) -> Row:
    """The node's row, locked for the admin command about it; ``Rejected`` when there is no such node."""
    node = await store.node(node_id, lock=True)
    if node is None:
        raise Rejected(f"unknown node {node_id}")
    return node


def quota_target(cmd: c.SetQuota) -> str:
    return f"{cmd.tenant_id}/{cmd.gpu_model}/{cmd.pool}" + (f"/{cmd.user_id}" if cmd.user_id else "")


# command -> (the kind of object it is about, that object's name in a rejection)
TARGETS: dict[str, tuple[c.TargetKind | None, Callable[[Any], str]]] = {
    "scheduler.register_node": ("node", lambda cmd: str(cmd.node_id)),
    "scheduler.report_topology": ("node", lambda cmd: str(cmd.node_id)),
    "scheduler.approve_slot_map": ("node", lambda cmd: str(cmd.node_id)),
    "scheduler.update_node": ("node", lambda cmd: str(cmd.node_id)),
    "scheduler.define_shape": ("shape", lambda cmd: cmd.name),
    "scheduler.define_pool": ("pool", lambda cmd: cmd.name),
    "scheduler.set_quota": ("quota", quota_target),
    "scheduler.cancel_request": ("allocation", lambda cmd: str(cmd.allocation_id)),
    "scheduler.run_burn_in": ("node", lambda cmd: str(cmd.node_id)),
    "scheduler.drain_node": ("node", lambda cmd: str(cmd.node_id)),
    "scheduler.set_health_policy": (None, lambda cmd: cmd.condition),   # a condition: no kind of its own
    "scheduler.close_breaker": ("pool", lambda cmd: cmd.pool),
}


async def reject(ctx: UnitOfWork, command: str, target: str, reason: str) -> None:
    """Emit the rejection of ``command`` about ``target`` (its kind from ``TARGETS``)."""
    kind = TARGETS[command][0] if command in TARGETS else None
    target, reason = text_safe(target), text_safe(reason, 2000)   # they may quote the refused input
    log.warning("scheduler.admin_command_rejected", command=command, target=target, target_kind=kind, reason=reason)
    await ctx.emit("scheduler.admin_command_rejected",
                   c.AdminCommandRejected(command=command, target=target, target_kind=kind, reason=reason))


async def admin(ctx: UnitOfWork, store: SchedulerRepository, command: str, target: str,
                body: Callable[[], Awaitable[None]]) -> None:
    """Run ``body`` in a savepoint of ``store``; a ``Rejected`` rolls back everything it wrote and emits the
    rejection."""
    try:
        async with store.savepoint():
            await body()
    except Rejected as rej:
        await reject(ctx, command, target, rej.reason)


def refused(command: str, active: ActiveScheduler) -> Refusal:
    """The ``on_refused`` of ``command``'s subscription: the handler failed for good (its transaction rolled
    back); the index may hold what it decided before failing, so it is reloaded before the next decision."""
    target_of = TARGETS[command][1]

    async def on_refused(ctx: UnitOfWork, cmd: Any, reason: str) -> None:
        active.needs_reload = True
        await reject(ctx, command, target_of(cmd), reason)
    return on_refused


async def emit_node(ctx: UnitOfWork, store: SchedulerRepository, node_id: uuid.UUID, *,
                    correlation_id: str | None = None) -> dict:
    """Emit ``scheduler.node_changed`` with the node's whole committed-to-be document; returns it
    (``correlation_id``: for work no message caused, such as the health monitor's)."""
    doc = await store.node_document(node_id)
    await ctx.emit("scheduler.node_changed", c.NodeChanged(**doc), correlation_id=correlation_id)
    return doc


class LeftForBatch:
    """Work of one kind (``name``) that the handlers of a batch leave to be done together just before it writes
    (``Writes.later``): what each left, by allocation, in ``left``; ``flush`` does it and answers each."""

    name: ClassVar[str]

    def __init__(self, active: ActiveScheduler, ctx: UnitOfWork):
        self.active, self.ctx = active, ctx
        self.left: dict[uuid.UUID, Any] = {}

    @classmethod
    def of(cls, ctx: UnitOfWork, active: ActiveScheduler) -> Self | None:
        """The batch's work of this kind (started by the first handler that leaves some), or None when ``ctx``'s
        handler must do its own at once (not a batched run)."""
        writes = ctx.writes
        if not writes.batched:
            return None
        later = writes.later.get(cls.name)
        if later is None:
            later = writes.later[cls.name] = cls(active, ctx)
        return later

    async def flush(self) -> None:
        raise NotImplementedError
