"""Scheduler's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers


def wire(rt: Runtime) -> None:
    rt.consumers.subscribe("scheduler.register_node", handlers.register_node)
    rt.consumers.subscribe("scheduler.reserve_slots", partial(handlers.reserve_slots, sim_faults=rt.settings.sim_faults))
    rt.consumers.subscribe("scheduler.release_slots", handlers.release_slots)
