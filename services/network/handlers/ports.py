"""Saga steps: move a bare-metal server's switch port onto its tenant network at hand-off (bind), and back to the
provisioning network for cleaning (unbind, the undo).

A server deploys on the provisioning network (the leaf's day-0 configuration puts its port there). Bind takes the
tenant's lock, finds the allocation's attachment (the attach step gave it its address and VNI), moves the
attachment to the leaf the server is cabled to when the plan had placed it on another (``rehome``), records the
binding and has every fabric driver move the port: the port leaves the provisioning VLAN, then becomes an access
port of the network's VLAN on that leaf, which carries its VNI (the Linux leaf driver runs it; EVPN renders NVUE's
access VLAN; UFM adds the server's HCA GUIDs to the tenant's partition). All of it, or nothing: a refusal (the leaf
has no such port, a command fails) rolls the step back, puts the leaf back as the tables say (the port on the
provisioning network, nothing of the tenant left) and fails the step with the leaf's words.

Unbind deletes the binding and moves the port back (idempotent: nothing bound, nothing done). A refusal there is
retried (the message is redelivered): the port must not stay on the tenant network, and a leaf that cannot be
reached now may be later. Detach unbinds too, so a port never outlives its attachment on the tenant network.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from functools import partial

from shared.participant import StepRejected, invoke, over, undo
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.fabric import FabricDriver, FabricRefused, PortChange
from ..adapters.repository import PgNetworkRepository
from ..domain.model import Attachment, NetworkPlan, PortBinding
from ..domain.ports import NetworkRepository
from .leaves import join_leaf, leave_leaf
from .tenancy import RepositoryFactory


async def bind_step(networks: NetworkRepository, cmd: c.BindPort, *, ctx: UnitOfWork, plan: NetworkPlan,
                    fabric: list[FabricDriver]) -> dict:
    """The bind step's effect (see the module docstring); returns the reply's fields. Raises StepRejected."""
    started = time.monotonic()
    leaf, port = cmd.switch_port.leaf, cmd.switch_port.port
    found = await networks.attachment_for(cmd.allocation_id)
    if found is None:
        raise StepRejected(f"allocation {cmd.allocation_id} has no network attachment: nothing to move its port to")
    await networks.lock_tenant(found[1])
    a, tenant_id = await networks.attachment_for(cmd.allocation_id) or found
    existing = await networks.binding_for(cmd.allocation_id)
    if existing is not None:
        if (existing.leaf, existing.port) != (leaf, port):
            raise StepRejected(f"allocation {cmd.allocation_id} is bound to {existing.leaf}/{existing.port}, "
                               f"not {leaf}/{port}")
        return _bound(existing, time.monotonic() - started)
    holder = await networks.port_holder(leaf, port)
    if holder is not None:
        raise StepRejected(f"port {port} of leaf {leaf} is on the tenant network of allocation {holder}")
    try:
        async with networks.savepoint():
            if a.leaf != leaf:
                a = await _rehome(networks, a, tenant_id, leaf, ctx=ctx, plan=plan, fabric=fabric)
            vlan = await networks.held(f"vlan:{leaf}", a.network_id)
            binding = PortBinding(cmd.allocation_id, tenant_id, a.network_id, cmd.node_id, leaf, port, vlan, a.vni,
                                  tuple(cmd.hca_guids))
            await networks.add_binding(binding)
            change = await _port_change(networks, binding, str(a.ip_address))
            for driver in fabric:
                await driver.move_port(ctx.conn, "bind", change)
    except (FabricRefused, StepRejected) as exc:
        for driver in fabric:   # the savepoint undid the tables: the leaf follows them (the port back, nothing left)
            await driver.settle(ctx.conn, leaf, restore=(port,))
        raise StepRejected(f"moving port {port} of leaf {leaf} to the tenant network: {exc.reason}") from None
    seconds = time.monotonic() - started
    await _moved(ctx, binding, "tenant", vlan, seconds)
    return _bound(binding, seconds)


def _bound(b: PortBinding, seconds: float) -> dict:
    return {"network_id": b.network_id, "leaf": b.leaf, "port": b.port, "vlan": b.vlan, "vni": b.vni,
            "moved_s": round(seconds, 3)}


async def _rehome(networks: NetworkRepository, a: Attachment, tenant_id: uuid.UUID, leaf: str, *, ctx: UnitOfWork,
                  plan: NetworkPlan, fabric: list[FabricDriver]) -> Attachment:
    """The attachment served by ``leaf`` (the one the server is cabled to) instead of the plan's guess."""
    await leave_leaf(networks, a, tenant_id, ctx=ctx, fabric=fabric)
    moved = dataclasses.replace(a, leaf=leaf)
    await join_leaf(networks, moved, tenant_id, ctx=ctx, plan=plan, fabric=fabric)
    return moved


async def _port_change(networks: NetworkRepository, b: PortBinding, address: str | None = None) -> PortChange:
    res = await networks.tenant(b.tenant_id)
    return PortChange(tenant_id=b.tenant_id, network_id=b.network_id, allocation_id=b.allocation_id,
                      node_id=b.node_id, leaf=b.leaf, port=b.port, vlan=b.vlan, vni=b.vni, pkey=res.pkey,
                      hca_guids=b.hca_guids, address=address)


async def _moved(ctx: UnitOfWork, b: PortBinding, phase: str, vlan: int, seconds: float) -> None:
    await ctx.emit("network.port_moved", c.PortMoved(
        tenant_id=b.tenant_id, allocation_id=b.allocation_id, node_id=b.node_id, leaf=b.leaf, port=b.port,
        phase=phase, vlan=vlan, seconds=round(seconds, 3)), tenant_id=b.tenant_id)


async def unbind(networks: NetworkRepository, allocation_id: uuid.UUID, *, ctx: UnitOfWork,
                 fabric: list[FabricDriver], plan: NetworkPlan) -> dict:
    """Return the allocation's server port to the provisioning network (nothing bound: nothing done); the reply's
    fields. The caller holds the tenant's lock. Raises FabricRefused (retried: the message comes again)."""
    b = await networks.binding_for(allocation_id)
    if b is None:
        return {}
    started = time.monotonic()
    await networks.delete_binding(b.allocation_id)
    change = await _port_change(networks, b)
    for driver in fabric:
        await driver.move_port(ctx.conn, "unbind", change)
    seconds = time.monotonic() - started
    await _moved(ctx, b, "cleaning", plan.provisioning_vlan, seconds)
    return {"leaf": b.leaf, "port": b.port, "moved_s": round(seconds, 3)}


async def unbind_step(networks: NetworkRepository, cmd: c.UnbindPort, *, ctx: UnitOfWork, plan: NetworkPlan,
                      fabric: list[FabricDriver]) -> dict:
    """The unbind step's effect (see the module docstring); the reply's fields."""
    bound = await networks.binding_for(cmd.allocation_id)
    if bound is None:
        return {}
    await networks.lock_tenant(bound.tenant_id)   # unbind reads the binding again, under the lock
    return await unbind(networks, cmd.allocation_id, ctx=ctx, fabric=fabric, plan=plan)


async def bind_port(ctx: UnitOfWork, cmd: c.BindPort, *, plan: NetworkPlan, fabric: list[FabricDriver] = (),
                    sim_faults: bool = False, repository: RepositoryFactory = PgNetworkRepository) -> None:
    """Saga step: the server's port onto its tenant network, once per key; a refusal → the step's failure."""
    step = partial(bind_step, ctx=ctx, plan=plan, fabric=list(fabric))
    await invoke(ctx, cmd, over(repository, step), step=c.BIND_PORT, sim_faults=sim_faults)


async def unbind_port(ctx: UnitOfWork, cmd: c.UnbindPort, *, plan: NetworkPlan, fabric: list[FabricDriver] = (),
                      repository: RepositoryFactory = PgNetworkRepository) -> None:
    """Saga step or compensation: the server's port back on the provisioning network (idempotent)."""
    step = partial(unbind_step, ctx=ctx, plan=plan, fabric=list(fabric))
    await undo(ctx, cmd, over(repository, step), step=c.BIND_PORT)
