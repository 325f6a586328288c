"""Billing's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers


def wire(rt: Runtime) -> None:
    rt.consumers.subscribe("billing.start_meter", partial(handlers.start_meter, sim_faults=rt.settings.sim_faults))
    rt.consumers.subscribe("billing.stop_meter", handlers.stop_meter)
