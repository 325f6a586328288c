"""Allocation's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers


def wire(rt: Runtime) -> None:
    faults = rt.settings.sim_faults
    rt.consumers.subscribe("allocation.request", handlers.request)
    rt.consumers.subscribe("allocation.mark_provisioning", handlers.mark_provisioning)
    rt.consumers.subscribe("allocation.activate", partial(handlers.activate, sim_faults=faults))
    rt.consumers.subscribe("allocation.fail", handlers.fail)
    rt.consumers.subscribe("allocation.release", handlers.release)
    rt.consumers.subscribe("allocation.preempt", handlers.preempt)
    rt.consumers.subscribe("allocation.mark_released", partial(handlers.mark_released, sim_faults=faults))
