"""Allocation's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..contracts import ACTIVATE, FAIL_ALLOCATION, MARK_PROVISIONING, MARK_RELEASED


def wire(rt: Runtime) -> None:
    faults = rt.settings.sim_faults
    rt.consumers.subscribe("allocation.request", handlers.request)
    rt.consumers.participate(MARK_PROVISIONING, invoke=handlers.mark_provisioning)
    rt.consumers.participate(ACTIVATE, invoke=partial(handlers.activate, sim_faults=faults))
    rt.consumers.participate(FAIL_ALLOCATION, invoke=handlers.fail)
    rt.consumers.subscribe("allocation.release", handlers.release)
    rt.consumers.subscribe("allocation.preempt", handlers.preempt)
    rt.consumers.participate(MARK_RELEASED, invoke=partial(handlers.mark_released, sim_faults=faults))
