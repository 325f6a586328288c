"""Scheduler's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers as h

ROUTES = {
    "scheduler.register_node": h.register_node,
    "scheduler.report_topology": h.report_topology,
    "scheduler.approve_slot_map": h.approve_slot_map,
    "scheduler.update_node": h.update_node,
    "scheduler.define_shape": h.define_shape,
    "scheduler.define_pool": h.define_pool,
    "scheduler.set_quota": h.set_quota,
    "scheduler.cancel_request": h.cancel_request,
    "scheduler.release_slots": h.release_slots,
}


def wire(rt: Runtime, active: h.ActiveScheduler) -> list:
    """Register every subscriber; returns the broker's new subscriber objects (to start and stop them
    with leadership)."""
    before = set(map(id, rt.broker.subscribers))
    for type_, handler in ROUTES.items():
        rt.consumers.subscribe(type_, partial(handler, active=active))
    rt.consumers.subscribe("scheduler.reserve_slots",
                           partial(h.reserve_slots, active=active, sim_faults=rt.settings.sim_faults))
    return [s for s in rt.broker.subscribers if id(s) not in before]
