"""The node-agent's handlers for running instances: a tenant's power actions, console reads, and the instance
reconcile (domains no allocation owns, allocations whose instance vanished).

A power action runs in the consumer's transaction under the allocation's lock (never beside its provision or
deprovision) and always answers ``node_agent.power_changed``, ok or not: a refusal (no instance here, another
tenant's allocation, a command past its deadline, the driver's error) is visible on the allocation's action,
never silent.

The reconcile compares what the driver runs on this node with the node's instance rows. It only touches an
allocation whose lock it gets at once (a provision or deprovision in flight holds it), and only instances its
driver lists, which are Tessera's and this node's: nothing foreign is ever touched.
"""
from __future__ import annotations

import uuid

import asyncpg
import structlog

from shared.envelope import utcnow
from shared.outbox import Outbox
from shared.refusals import PermanentError
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.drivers import DriverError
from ..domain.model import KeptInstance
from .node import Node
from .spec import instance_spec

log = structlog.get_logger()


def tenants_instance(command: str | None, tenant_id: uuid.UUID) -> bool:
    """Whether the instance made from ``command`` (a row's) is ``tenant_id``'s: only its own tenant acts on it."""
    return command is not None and c.ProvisionNode.model_validate_json(command).tenant_id == tenant_id


async def power(ctx: UnitOfWork, cmd: c.RequestPower, *, node: Node) -> None:
    """Carry out the action through the driver; answer power_changed with the outcome and the power state.

    A command handled after its ``expires_at`` is refused without acting (the tenant, and the gateway, have
    given up on it); the deadline is checked once the allocation's lock is held, right before acting, so a
    wait behind a slow provision counts."""
    if cmd.node_id != node.id:
        raise PermanentError(f"power action for node {cmd.node_id} arrived at node {node.id}")
    records = node.records(ctx.conn)
    await records.lock_allocation(cmd.allocation_id)
    state, reason, received_at = "unknown", None, utcnow()
    if not tenants_instance(await records.command_of(cmd.allocation_id), cmd.tenant_id):
        reason = f"allocation {cmd.allocation_id} has no instance on node {node.id}"
    elif received_at > cmd.expires_at:
        reason = (f"expired: the node received it at {received_at.isoformat()}, after its deadline "
                  f"{cmd.expires_at.isoformat()}")
        state = await _power_state(node, cmd.allocation_id)
    else:
        try:
            state = await node.driver.power(cmd.allocation_id, cmd.action)
        except DriverError as exc:
            reason = str(exc)
    log.info("node_agent.power", allocation_id=str(cmd.allocation_id), action=cmd.action, requested_by=str(cmd.requested_by),
             ok=reason is None, power_state=state, reason=reason)
    await ctx.emit("node_agent.power_changed", c.PowerChanged(
        request_id=cmd.request_id, allocation_id=cmd.allocation_id, tenant_id=cmd.tenant_id, node_id=node.id,
        action=cmd.action, requested_by=cmd.requested_by, ok=reason is None, power_state=state,
        reason=reason[:2000] if reason else None, at=utcnow()), subject_params=node.subject_params, tenant_id=cmd.tenant_id)


async def _power_state(node: Node, allocation_id: uuid.UUID) -> str:
    """The instance's power state as the driver tells it, changing nothing ("unknown" when it cannot say)."""
    try:
        return (await node.driver.instance_info(allocation_id)).get("power_state") or "unknown"
    except DriverError:
        return "unknown"


async def read_console(node: Node, pool: asyncpg.Pool, req: c.ReadConsole) -> c.ConsoleChunk:
    """The answer to node_agent.read_console: only the requesting tenant's own allocation has a console."""
    async with pool.acquire() as conn:
        command = await node.records(conn).command_of(req.allocation_id)
    if not tenants_instance(command, req.tenant_id):
        return c.ConsoleChunk(found=False, offset=0, next_offset=0)
    chunk = await node.driver.console(req.allocation_id, req.offset, req.limit)
    if chunk is None:
        return c.ConsoleChunk(found=False, offset=0, next_offset=0)
    return c.ConsoleChunk(found=True, offset=chunk.offset, next_offset=chunk.next_offset, text=chunk.text,
                          running=chunk.running)


async def _problem(pool: asyncpg.Pool, outbox: Outbox, node: Node, problem: c.InstanceProblem) -> None:
    async with UnitOfWork.begin(pool, outbox, name="node_agent.instance_reconcile") as uow:
        await uow.emit("node_agent.instance_problem", problem, subject_params=node.subject_params,
                       correlation_id=str(problem.allocation_id or problem.instance_id))
    log.warning("node_agent.instance_problem", **problem.model_dump(mode="json"))


async def reconcile_instances(node: Node, pool: asyncpg.Pool, outbox: Outbox) -> list[c.InstanceProblem]:
    """Remove instances no allocation owns here; make again the instances of allocations whose instance vanished
    (from the command they were made with). Each finding is emitted as node_agent.instance_problem."""
    problems = []
    running = {i.allocation_id: i for i in await node.driver.list_instances()}
    async with pool.acquire() as conn:
        rows = await node.records(conn).instances()
    for allocation_id in set(running) | set(rows):
        if (allocation_id in running) == (allocation_id in rows):
            continue
        async with pool.acquire() as conn, conn.transaction():
            records = node.records(conn)
            if not await records.try_lock_allocation(allocation_id):
                continue   # a command for it is being handled: it decides
            row = await records.instance(allocation_id)
            found = await node.driver.instance_of(allocation_id)   # again, under the lock
            if found is not None and row is None:
                await node.driver.deprovision(allocation_id)
                await node.plumbing(node.dataplane.detach, allocation_id)
                problems.append(c.InstanceProblem(node_id=node.id, allocation_id=allocation_id,
                                                  instance_id=found.instance_id, problem="orphan_removed",
                                                  detail="no allocation owns this instance on the node: removed"))
            elif found is None and row is not None:
                problems.append(await _remake(node, allocation_id, row))
    for p in problems:
        await _problem(pool, outbox, node, p)
    return problems


async def _remake(node: Node, allocation_id: uuid.UUID, row: KeptInstance) -> c.InstanceProblem:
    """The allocation's instance vanished (a host reboot, someone's virsh undefine): make it again from its command."""
    detail = "the instance vanished"
    if row.command is None:
        return c.InstanceProblem(node_id=node.id, allocation_id=allocation_id, instance_id=row.instance_id,
                                 problem="instance_missing", detail=f"{detail}; no command kept to make it again")
    try:
        await node.driver.provision(instance_spec(c.ProvisionNode.model_validate_json(row.command), await node.guest_mtu()))
    except Exception as exc:   # noqa: BLE001 -- reported: an operator (or the next reconcile) takes it from here
        return c.InstanceProblem(node_id=node.id, allocation_id=allocation_id, instance_id=row.instance_id,
                                 problem="instance_missing", detail=f"{detail}; making it again failed: {exc}"[:2000])
    return c.InstanceProblem(node_id=node.id, allocation_id=allocation_id, instance_id=row.instance_id,
                             problem="instance_restarted", detail=f"{detail}; made again from its image")


def power_refused(node: Node):
    """The power subscription's ``on_refused``: a command no retry can carry out (addressed to another node, data
    PostgreSQL refuses) is answered power_changed ok=false with the reason at once, so its action does not wait
    for the gateway's deadline."""
    async def on_refused(ctx: UnitOfWork, cmd: c.RequestPower, reason: str) -> None:
        await ctx.emit("node_agent.power_changed", c.PowerChanged(
            request_id=cmd.request_id, allocation_id=cmd.allocation_id, tenant_id=cmd.tenant_id, node_id=node.id,
            action=cmd.action, requested_by=cmd.requested_by, ok=False, power_state="unknown",
            reason=reason[:2000], at=utcnow()), subject_params=node.subject_params, tenant_id=cmd.tenant_id)
    return on_refused

