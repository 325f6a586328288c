"""Network's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..domain.model import NetworkPlan


def wire(rt: Runtime, plan: NetworkPlan) -> None:
    rt.consumers.subscribe("network.attach_network",
                           partial(handlers.attach_network, plan=plan, sim_faults=rt.settings.sim_faults))
    rt.consumers.subscribe("network.detach_network", handlers.detach_network)
