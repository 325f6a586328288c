"""What the node-agents say of the instances they run, projected for the tenants: a power action's outcome
(``node_agent.power_changed``: the action row and the instance's power state) and a problem reconcile found
with an allocation's instance (``node_agent.instance_problem``); and where a bare-metal server's switch port is
(``network.port_moved``: the instance's ``network_phase``). Both are appended to the allocation's event
stream, in the consumer's transaction (inbox dedupe included).

The power state only moves to a newer change (``PowerChanged.at``), whatever order the outcomes arrive in.

A late answer (the sweep had failed the action for want of one by its deadline plus the grace) is recorded
all the same: the node did what it says, so its outcome wins, a success included, and the reason says it came
late, followed by the sweep's. Keeping ``failed`` would tell the tenant a reboot that happened did not; the
outcome stands beside the gateway.power_action_expired event in the allocation's stream, so nothing changes
silently. (A node that gets the command after its deadline refuses it: a late success means the node acted in
time and its answer was slow.)
"""
from __future__ import annotations

import structlog

from services.network.contracts import PortMoved
from services.node_agent.contracts import InstanceProblem, PowerChanged
from shared.unit_of_work import UnitOfWork

from ...adapters.allocations import append_event
from . import power_views as repo

log = structlog.get_logger()


async def on_power_changed(ctx: UnitOfWork, data: PowerChanged) -> None:
    await append_event(ctx.conn, data.allocation_id, ctx.causation)
    late = ("the node carried it out, answering after the gateway had given up on it" if data.ok else
            f"the node answered after the gateway had given up on it: {data.reason or 'failed'}")
    finished = await repo.finish_action(ctx.conn, data.request_id, data.allocation_id, ok=data.ok, reason=data.reason,
                                        late_reason=late, power_state=data.power_state, at=data.at)
    if finished is None:   # not asked through this gateway, or its outcome was recorded already
        log.info("projection.power_outcome_without_pending_action", action_id=str(data.request_id),
                 allocation_id=str(data.allocation_id))
    elif finished == "late":
        log.warning("projection.power_outcome_after_expiry", action_id=str(data.request_id),
                    allocation_id=str(data.allocation_id), ok=data.ok)
    await repo.set_power_state(ctx.conn, data.allocation_id, data.power_state, data.at)
    log.info("audit.power_action_finished", action_id=str(data.request_id), allocation_id=str(data.allocation_id),
             user_id=str(data.requested_by), action=data.action, ok=data.ok, power_state=data.power_state,
             reason=data.reason)


async def on_instance_problem(ctx: UnitOfWork, data: InstanceProblem) -> None:
    """Shown in the allocation's event stream; a problem with no allocation (an orphan) is the operators'."""
    if data.allocation_id is None:
        return
    await append_event(ctx.conn, data.allocation_id, ctx.causation)


async def on_port_moved(ctx: UnitOfWork, data: PortMoved) -> None:
    """A bare-metal server's port moved: its instance's network phase (tenant at hand-off, which the activation
    says too; cleaning once the release returned it to the provisioning network), in its event stream."""
    await append_event(ctx.conn, data.allocation_id, ctx.causation)
    if not await repo.set_network_phase(ctx.conn, data.allocation_id, data.phase, data.seconds):
        log.info("projection.port_moved_before_activation", allocation_id=str(data.allocation_id), phase=data.phase)
