"""Periodic work, run by the runtime for the life of the process: forget idempotency keys once their retention
has passed; fail the power actions no node answered by their deadline plus a grace.

Every replica runs both: each change is one idempotent statement (a key already purged, an action no longer
pending, is left alone), so no leader is needed."""
from __future__ import annotations

import asyncio

import structlog

from shared.envelope import utcnow
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from ..adapters import allocations as repo
from ..api.allocations import power_views as instances
from ..contracts import PowerActionExpired
from ..api.allocations.projection import append_event, lock_events

log = structlog.get_logger()
SWEEP_BATCH = 100


async def purge_idempotency_keys_forever(rt: Runtime, ttl_s: float, every_s: float = 600.0) -> None:
    """Delete keys older than ``ttl_s`` every ``every_s``; a key may be reused after that (runs until cancelled)."""
    while True:
        async with rt.pool.acquire() as conn:
            purged = await repo.purge_idempotency_keys(conn, ttl_s)
        if purged:
            log.info("idempotency_keys.purged", count=purged)
        await asyncio.sleep(every_s)


async def expire_power_actions_forever(rt: Runtime, grace_s: float, every_s: float) -> None:
    """Every ``every_s``, fail the pending actions past their deadline plus ``grace_s`` (runs until cancelled)."""
    while True:
        while await expire_power_actions(rt, grace_s) == SWEEP_BATCH:
            pass   # a full batch: more may be overdue
        await asyncio.sleep(every_s)


async def expire_power_actions(rt: Runtime, grace_s: float) -> int:
    """Fail up to SWEEP_BATCH overdue actions, each in its own transaction: the action row, the
    gateway.power_action_expired event (on the bus, and in the allocation's event stream). Returns how many
    candidates it looked at.

    The allocation's event lock is taken before the action's row, the order ``projections.instances`` takes
    them in, so the sweep and a node's answer to the same action never deadlock; whichever commits first wins
    and the other sees it (a late answer is still recorded: ``adapters.instances.finish_action``)."""
    async with rt.pool.acquire() as conn:
        overdue = await instances.overdue_actions(conn, grace_s, SWEEP_BATCH)
    for candidate in overdue:
        reason = (f"expired: no answer from node {candidate['node_id']} by the deadline "
                  f"{candidate['expires_at'].isoformat()}; the node refuses the command should it get it later")
        async with UnitOfWork.begin(rt.pool, rt.outbox, name="gateway.power_action_expired") as uow:
            await lock_events(uow.conn, candidate["allocation_id"])
            row = await instances.expire_action(uow.conn, candidate["id"], grace_s, reason)
            if row is None:   # answered meanwhile, or another replica was first
                continue
            env = await uow.emit("gateway.power_action_expired", PowerActionExpired(
                request_id=row["id"], allocation_id=row["allocation_id"], tenant_id=row["tenant_id"],
                node_id=row["node_id"], action=row["action"], requested_by=row["user_id"],
                expires_at=row["expires_at"], reason=reason, at=utcnow()),
                correlation_id=str(row["allocation_id"]), tenant_id=row["tenant_id"])
            await append_event(uow.conn, row["allocation_id"], env)
        log.warning("audit.power_action_expired", action_id=str(row["id"]), allocation_id=str(row["allocation_id"]),
                    node_id=str(row["node_id"]), user_id=str(row["user_id"]), action=row["action"],
                    expires_at=row["expires_at"].isoformat())
    return len(overdue)
