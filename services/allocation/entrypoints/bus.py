"""Allocation's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..contracts import ACTIVATE, FAIL_ALLOCATION, MARK_RELEASED


def wire(rt: Runtime) -> None:
    faults = rt.settings.sim_faults
    # a plain command that can never apply is answered allocation.command_rejected at once
    rt.consumers.subscribe("allocation.request", handlers.request, on_refused=handlers.refused("allocation.request"))
    rt.consumers.participate(ACTIVATE, invoke=partial(handlers.activate, sim_faults=faults))
    rt.consumers.participate(FAIL_ALLOCATION, invoke=handlers.fail)
    rt.consumers.subscribe("allocation.release", handlers.release, on_refused=handlers.refused("allocation.release"))
    rt.consumers.subscribe("allocation.preempt", handlers.preempt, on_refused=handlers.refused("allocation.preempt"))
    rt.consumers.subscribe("allocation.interrupt", handlers.interrupt,
                           on_refused=handlers.refused("allocation.interrupt"))
    rt.consumers.participate(MARK_RELEASED, invoke=partial(handlers.mark_released, sim_faults=faults))
