"""The gateway's subscribers: one durable consumer per projected message type (wire message → handler)."""
from __future__ import annotations

from shared.runtime import Runtime

from .. import projection as p
from .. import projection_scheduler
from ..adapters import networks as network_projection


def wire(rt: Runtime) -> None:
    rt.consumers.subscribe("allocation.requested", p.on_requested)
    rt.consumers.subscribe("allocation.provisioning", p.on_provisioning)
    rt.consumers.subscribe("allocation.activated", p.on_activated)
    rt.consumers.subscribe("allocation.release_requested", p.on_release_requested)
    rt.consumers.subscribe("allocation.released", p.on_released)
    rt.consumers.subscribe("allocation.failed", p.on_failed)
    rt.consumers.subscribe("allocation.command_rejected", p.on_command_rejected)
    rt.consumers.subscribe("saga.step_changed", p.on_saga_step_changed)
    rt.consumers.subscribe("scheduler.node_registered", p.on_node_registered)
    for type_, handler in projection_scheduler.HANDLERS.items():
        rt.consumers.subscribe(type_, handler)
    for type_, handler in network_projection.HANDLERS.items():
        rt.consumers.subscribe(type_, handler)
