"""Scheduler's subscribers: wire message → handler, nothing else. Every one is leader-only: it runs while
this replica decides (see entrypoints/loops.py, Leadership). A command the handler can never apply (invalid
data, an unknown reference) is refused at once with ``scheduler.admin_command_rejected`` (``h.refused``)."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers as h
from ..contracts import RESERVE_SLOTS
from ..handlers import health

ROUTES = {
    "scheduler.register_node": h.register_node,
    "scheduler.report_topology": h.report_topology,
    "scheduler.approve_slot_map": h.approve_slot_map,
    "scheduler.update_node": h.update_node,
    "scheduler.define_shape": h.define_shape,
    "scheduler.define_pool": h.define_pool,
    "scheduler.set_quota": h.set_quota,
    "scheduler.cancel_request": h.cancel_request,
    "scheduler.run_burn_in": h.run_burn_in,
    "scheduler.drain_node": health.drain_node,
    "scheduler.set_health_policy": health.set_health_policy,
    "scheduler.close_breaker": health.close_breaker,
}
# the node-agents' results: every node's (the subject's node id is a wildcard)
NODE_EVENTS = {
    "node_agent.burn_in_finished": h.burn_in_finished,
    "node_agent.slot_rewiped": h.slot_rewiped,
}


def wire(rt: Runtime, active: h.ActiveScheduler) -> None:
    # exclusive: one batch at a time across every subscriber (and the loops that change placements), so the
    # index follows the database transaction by transaction and no two batches lock rows in different orders;
    # one worker each: what arrives while a batch runs is the next batch (more workers would only split it)
    for type_, handler in ROUTES.items():
        rt.consumers.subscribe(type_, partial(handler, active=active), leader_only=True, exclusive=True,
                               max_workers=1, on_refused=h.refused(type_, active))
    for type_, handler in NODE_EVENTS.items():
        rt.consumers.subscribe(type_, partial(handler, active=active), leader_only=True, exclusive=True,
                               max_workers=1)
    # gangs: a refused reserve is answered gang_rejected (its sender waits for a gang answer, not an admin one)
    rt.consumers.subscribe("scheduler.reserve_gang", partial(h.reserve_gang, active=active), leader_only=True,
                           exclusive=True, max_workers=1, on_refused=h.refused_gang(active))
    rt.consumers.subscribe("scheduler.cancel_gang", partial(h.cancel_gang, active=active), leader_only=True,
                           exclusive=True, max_workers=1)
    rt.consumers.participate(RESERVE_SLOTS, leader_only=True, exclusive=True, max_workers=1,
                             invoke=partial(h.reserve_slots, active=active, sim_faults=rt.settings.sim_faults),
                             undo=partial(h.release_slots, active=active))
