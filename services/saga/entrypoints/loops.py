"""The deadline loop: every ``poll_s`` it feeds passed step and undo deadlines to their sagas, and starts waiting
requests of tenants with room in their line that an ending saga missed (handlers.fill_short_lines), and tells the
requests waiting in lines that moved their places (handlers.tell_moved_lines).

A plain short poll, on every replica, that first looks which of the three has anything to do (one statement,
``adapters.repository.due``): deadlines are rows in saga_steps, claimed with SKIP LOCKED, and a tenant's line is
filled under its lock (not waited for), so replicas share the passed deadlines and each is handled once (one
``UnitOfWork`` per saga, see handlers.expire_due).
"""
from __future__ import annotations

from shared.runtime import Runtime

from .. import handlers
from ..adapters import repository
from ..domain.model import Policy


def wire(rt: Runtime, policy: Policy, poll_s: float) -> None:
    async def deadlines() -> None:
        async with rt.pool.acquire() as conn:   # one look; most passes find nothing to do
            due = await repository.due(conn, policy.tenant_inflight)
        if due.deadlines:
            await handlers.expire_due(rt.pool, rt.outbox, policy)
        if due.short_lines:
            await handlers.fill_short_lines(rt.pool, rt.outbox, policy)
        if due.moved_lines:
            await handlers.tell_moved_lines(rt.pool, rt.outbox)
    # every replica: claims are SKIP LOCKED and line fills take the tenant's lock without waiting
    rt.every(poll_s, deadlines, at_once=True)
