"""The scheduler's health monitor and the node-agents' fault answers into the health views (``health_views``):
each node's health document and its history (``scheduler.node_health_changed``), the health policy
(``scheduler.health_policy_changed``), the pools' breakers (``scheduler.breaker_changed``) and what a node did
with an injected fault (``node_agent.fault_injected``, from every node).

Each handler runs in the consumer's transaction (inbox dedupe included). The documents are version-guarded: an
older one never replaces a newer one (separate consumers, redelivery), though its history line is still kept,
in its place by version.
"""
from __future__ import annotations

import structlog

from services.node_agent.contracts import FaultInjected
from services.scheduler.contracts.health import BreakerChanged, HealthPolicyChanged, NodeHealthChanged
from shared.unit_of_work import UnitOfWork

from . import health_views as repo

log = structlog.get_logger()


async def on_node_health_changed(ctx: UnitOfWork, data: NodeHealthChanged) -> None:
    if not await repo.apply_health(ctx.conn, data, ctx.causation.occurred_at):
        log.info("projection.stale_document_ignored", kind="node_health", id=str(data.node_id), version=data.version)


async def on_health_policy_changed(ctx: UnitOfWork, data: HealthPolicyChanged) -> None:
    if not await repo.apply_policy(ctx.conn, data):
        log.info("projection.stale_document_ignored", kind="health_policy", id=data.condition, version=data.version)


async def on_breaker_changed(ctx: UnitOfWork, data: BreakerChanged) -> None:
    if not await repo.apply_breaker(ctx.conn, data):
        log.info("projection.stale_document_ignored", kind="breaker", id=data.pool, version=data.version)


async def on_fault_injected(ctx: UnitOfWork, data: FaultInjected) -> None:
    await repo.answer_fault(ctx.conn, data.request_id, data.node_id, data.kind, data.accepted, data.reason)
    (log.info if data.accepted else log.warning)("projection.fault_answered", node_id=str(data.node_id),
                                                 request_id=str(data.request_id), kind=data.kind,
                                                 accepted=data.accepted, reason=data.reason)
