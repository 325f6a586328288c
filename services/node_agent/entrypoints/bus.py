"""The node-agent's subscribers: only this node's subjects, under durable names unique to the node. Every
handler first waits the delay an injected slow_agent fault asks for (none unless injected)."""
from __future__ import annotations

import functools
from collections.abc import Callable

from shared.bus_identity import node_durable, node_identity
from shared.runtime import Runtime

from .. import handlers
from ..contracts import FENCE_NODE, PROVISION_NODE, WIPE_SLOTS


def slowed(node: handlers.Node, handler: Callable) -> Callable:
    """``handler``, run after the node's injected delay (a simulated slow agent)."""
    @functools.wraps(handler)
    async def run(*args, **kwargs):
        await node.slowed()
        return await handler(*args, **kwargs)
    return run


def wire(rt: Runtime, node: handlers.Node) -> None:
    # the durables' names are those the node's identity may use (shared.bus_identity, tooling.bus_permissions)
    params, durable = node.subject_params, node_identity(node.id)

    def delayed(handler: Callable) -> Callable:   # the handler over this node, after any injected delay
        return slowed(node, functools.partial(handler, node=node))

    # one command per transaction, several at once: the driver works (seconds, for a real VM) inside the
    # consumer's transaction, and one instance must not wait for another
    rt.consumers.participate(PROVISION_NODE, invoke=delayed(handlers.provision_node),
                             undo=delayed(handlers.deprovision_node), subject_params=params, durable=durable,
                             batch_size=1, max_workers=8)
    # a power action waits for the hypervisor (a stop up to its shutdown timeout): one per transaction too
    rt.consumers.subscribe("node_agent.power", delayed(handlers.power), subject_params=params,
                           durable=node_durable(node.id, "node_agent.power"), batch_size=1, max_workers=4,
                           on_refused=handlers.power_refused(node))
    # a wipe reads and writes the slots' disks for seconds: one per transaction, a few at once
    rt.consumers.participate(WIPE_SLOTS, invoke=delayed(handlers.wipe_slots), subject_params=params,
                             durable=durable, batch_size=1, max_workers=4)
    # a fence of bare metal waits for the BMC to power the server off and read it back (seconds): one per transaction
    rt.consumers.participate(FENCE_NODE, invoke=delayed(handlers.fence_node),
                             subject_params=params, durable=durable, batch_size=1, max_workers=2)
    for type_, handler in (("node_agent.rewipe", handlers.rewipe), ("node_agent.burn_in", handlers.burn_in),
                           ("node_agent.set_bmc", handlers.set_bmc)):
        rt.consumers.subscribe(type_, delayed(handler), subject_params=params,
                               durable=node_durable(node.id, type_), batch_size=1, max_workers=2)
    # a live mount waits for the kernel or the hypervisor (a VM's detach for its guest): one per transaction too
    for type_, handler in (("node_agent.mount_volume", handlers.mount_volume),
                           ("node_agent.unmount_volume", handlers.unmount_volume)):
        rt.consumers.subscribe(type_, delayed(handler), subject_params=params,
                               durable=node_durable(node.id, type_), batch_size=1, max_workers=4,
                               on_refused=handlers.volume_refused(node))
    # the node's health: faults a provider injects (a simulated node only), instances fenced for good
    for type_, handler in (("node_agent.inject_fault", handlers.inject_fault),
                           ("node_agent.fence_instances", handlers.fence_instances)):
        rt.consumers.subscribe(type_, functools.partial(handler, node=node), subject_params=params,
                               durable=node_durable(node.id, type_), batch_size=1, max_workers=1)
    rt.answer("node_agent.validate_bmc", lambda req: handlers.validate_bmc(node, req), **params)
    rt.answer("node_agent.read_console", lambda req: handlers.read_console(node, rt.pool, req), **params)
    if node.dataplane.kind == "none":
        return   # nothing plumbed, nothing to keep up to date
    # every node sees every tenant's changes (one durable per node); the dataplane ignores tenants not here
    rt.consumers.subscribe("network.tenant_networks_changed", delayed(handlers.tenant_networks_changed),
                           durable=node_durable(node.id, "network.tenant_networks_changed"))
