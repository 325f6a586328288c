"""Periodic work (the kit's ``rt.every``): forget idempotency keys once their retention has passed; fail the
power actions no node answered by their deadline plus a grace; read the tenants' weights, which the gateway
stamps on the messages it sends (``shared.fairness``).

Every replica runs all three: each change is one idempotent statement (a key already purged, an action no longer
pending, is left alone), so no leader is needed."""
from __future__ import annotations

from functools import partial

import structlog

from shared import fairness
from shared.envelope import utcnow
from shared.runtime import Runtime
from shared.unit_of_work import UnitOfWork

from ..adapters import allocations as repo
from ..adapters import identity
from ..adapters.allocations import append_event, lock_events
from ..api.allocations import power_views as instances
from ..contracts import PowerActionExpired
from ..settings import GatewaySettings

log = structlog.get_logger()
SWEEP_BATCH = 100
PURGE_EVERY_S = 600.0   # a key outlives its retention by ten minutes at most
WEIGHTS_REFRESH_S = 5.0   # a weight another replica changed is stamped here this much later at most


def wire(rt: Runtime, config: GatewaySettings) -> None:
    # every replica: one DELETE of the keys past their retention, idempotent
    rt.every(PURGE_EVERY_S, partial(purge_idempotency_keys, rt, config.idempotency_ttl_s), at_once=True)
    # every replica: each action is failed under its row lock, once (a replica second to it finds it done)
    rt.every(config.power_sweep_s, partial(expire_overdue_power_actions, rt, config.power_action_grace_s),
             at_once=True)
    # every replica: one read of the weights that are not the default
    rt.every(WEIGHTS_REFRESH_S, partial(refresh_tenant_weights, rt), at_once=True)


async def refresh_tenant_weights(rt: Runtime) -> None:
    """Replace the weights this process stamps with the table's."""
    async with rt.pool.acquire() as conn:
        fairness.weights.replace(await identity.tenant_weights(conn))


async def purge_idempotency_keys(rt: Runtime, ttl_s: float) -> int:
    """Delete keys older than ``ttl_s``; a key may be reused after that. Returns how many."""
    async with rt.pool.acquire() as conn:
        purged = await repo.purge_idempotency_keys(conn, ttl_s)
    if purged:
        log.info("idempotency_keys.purged", count=purged)
    return purged


async def expire_overdue_power_actions(rt: Runtime, grace_s: float) -> None:
    """Fail every pending action past its deadline plus ``grace_s``, a batch at a time."""
    while await expire_power_actions(rt, grace_s) == SWEEP_BATCH:
        pass   # a full batch: more may be overdue


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
