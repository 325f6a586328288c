"""Network's subscribers: wire message → handler, nothing else."""
from __future__ import annotations

from functools import partial

from shared.runtime import Runtime

from .. import handlers
from ..adapters.fabric import FabricDriver
from ..contracts import ATTACH_NETWORK, BIND_PORT
from ..domain.model import NetworkPlan


def wire(rt: Runtime, plan: NetworkPlan, fabric: list[FabricDriver]) -> None:
    rt.consumers.participate(ATTACH_NETWORK, invoke=partial(handlers.attach_network, plan=plan, fabric=fabric,
                                                            sim_faults=rt.settings.sim_faults),
                             undo=partial(handlers.detach_network, fabric=fabric, plan=plan))
    rt.consumers.participate(BIND_PORT, invoke=partial(handlers.bind_port, plan=plan, fabric=fabric,
                                                       sim_faults=rt.settings.sim_faults),
                             undo=partial(handlers.unbind_port, plan=plan, fabric=fabric))
    # a management command that can never apply is answered network.command_rejected at once
    rt.consumers.subscribe("network.create_network", partial(handlers.create_network, plan=plan),
                           on_refused=handlers.refused("create_network"))
    rt.consumers.subscribe("network.delete_network", handlers.delete_network,
                           on_refused=handlers.refused("delete_network"))
    rt.consumers.subscribe("network.add_security_rule", handlers.add_security_rule,
                           on_refused=handlers.refused("add_security_rule"))
    rt.consumers.subscribe("network.remove_security_rule", handlers.remove_security_rule,
                           on_refused=handlers.refused("remove_security_rule"))
