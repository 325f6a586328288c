"""The deadline loop: every ``poll_s`` it feeds passed step and undo deadlines to their sagas.

A plain short poll: deadlines are rows in saga_steps, claimed with SKIP LOCKED,
so any number of coordinator replicas can run this loop and each passed deadline
is handled once (one ``UnitOfWork`` per saga, see handlers.expire_due). The same loop starts waiting requests
of tenants with room in their line that an ending saga missed (handlers.fill_short_lines).
"""
from __future__ import annotations

import asyncio

from shared.runtime import Runtime

from .. import handlers
from ..domain.model import Policy


def deadline_loop(rt: Runtime, policy: Policy, poll_s: float):
    async def deadlines() -> None:
        while True:
            await handlers.expire_due(rt.pool, rt.outbox, policy)
            await handlers.fill_short_lines(rt.pool, rt.outbox, policy)
            await asyncio.sleep(poll_s)
    return deadlines


def wire(rt: Runtime, policy: Policy, poll_s: float) -> None:
    rt.background(deadline_loop(rt, policy, poll_s))
