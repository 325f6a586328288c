"""Network's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers, management
from ..domain.model import NetworkPlan
from ..fabric import FabricDriver


def wire(rt: Runtime, plan: NetworkPlan, fabric: list[FabricDriver]) -> None:
    rt.consumers.subscribe("network.attach_network", partial(handlers.attach_network, plan=plan, fabric=fabric,
                                                             sim_faults=rt.settings.sim_faults))
    rt.consumers.subscribe("network.detach_network", partial(handlers.detach_network, fabric=fabric))
    rt.consumers.subscribe("network.create_network", partial(management.create_network, plan=plan))
    rt.consumers.subscribe("network.delete_network", management.delete_network)
    rt.consumers.subscribe("network.add_security_rule", management.add_security_rule)
    rt.consumers.subscribe("network.remove_security_rule", management.remove_security_rule)
