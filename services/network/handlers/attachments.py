"""Saga steps: attach an allocation to a network of its tenant, detach it (undo).

Attach takes the tenant's lock, picks the named network (one of another tenant is "network
not found") or the tenant's "default" network (created on first use, on a subnet that overlaps
none of the tenant's networks: ``NetworkPlan.default_subnet``), gives the slot the
address the command asks to keep when it can (a reschedule re-attaches an allocation on another node
with the address it had: ``wanted_slot_address``) and otherwise the network's lowest free host after the
gateway, a MAC and an InfiniBand GUID derived from the attachment id, and a leaf-local VLAN on the leaf
serving the node; then every fabric driver renders and sends its calls, all in the step's transaction.
An allocation has at most one attachment: an attach of an attached allocation answers that attachment
when it is on the same node, and fails when it is on another (detach it there first). Detach undoes
exactly that and releases the address, the VLAN when the network's last slot leaves the leaf, and the
fabric config that only this slot needed; the allocation can then be attached again, anywhere.

The steps' effects (``attach_step``, ``detach_step``) reach storage through the ``NetworkRepository`` port
only; the handlers' ``repository`` keyword builds one on the unit of work's connection (the asyncpg one
unless told otherwise: the unit tests pass an in-memory fake). The fabric drivers are handed the unit of
work's connection: a recording driver writes its calls there, in the step's transaction.
"""
from __future__ import annotations

import uuid
from functools import partial

from services.network.contracts import SlotAttachment
from shared.participant import StepRejected, invoke, over, undo
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.fabric import FabricDriver
from ..adapters.repository import PgNetworkRepository
from ..domain.model import (
    DEFAULT_NETWORK,
    Attachment,
    NetworkPlan,
    TenantNetwork,
    guid_for,
    mac_for,
    slot_range,
    wanted_slot_address,
)
from ..domain.networks import Refused, owned
from ..domain.ports import NetworkRepository
from .leaves import join_leaf, leave_leaf
from .ports import unbind
from .tenancy import RepositoryFactory, changed, find, provision_network, snapshot


async def _reply(networks: NetworkRepository, a: Attachment, tenant_id: uuid.UUID, *, kept: bool) -> dict:
    net = next(n for n in await networks.networks_of(tenant_id) if n.id == a.network_id)
    slot = SlotAttachment(attachment_id=a.id, allocation_id=a.allocation_id, network_id=a.network_id,
                          ip_address=str(a.ip_address), prefix_len=net.cidr.prefixlen, mac_address=a.mac_address)
    tn = await snapshot(networks, tenant_id)
    return {"attachment_id": a.id, "vni": a.vni, "ip_address": str(a.ip_address), "mac_address": a.mac_address,
            "node_id": a.node_id, "kept_address": kept, "attachment": slot.model_dump(mode="json"),
            "tenant_networks": tn.model_dump(mode="json")}


async def _network(ctx: UnitOfWork, networks: NetworkRepository, cmd: c.AttachNetwork, plan: NetworkPlan) -> TenantNetwork:
    """The network to attach to; the tenant's default network is created (and announced) on first use."""
    nets = await networks.networks_of(cmd.tenant_id)
    if cmd.network_id is not None:
        return owned(cmd.network_id, nets)
    for net in nets:
        if net.name == DEFAULT_NETWORK:
            return net
    cidr = plan.default_subnet(n.cidr for n in nets)
    if cidr is None:
        raise Refused(f"no subnet of /{plan.tenant_cidr.prefixlen} left in {plan.default_pool} for the tenant's "
                      f"default network: its networks cover the pool; name a network")
    net = await provision_network(networks, plan, cmd.tenant_id, nets, uuid.uuid4(), DEFAULT_NETWORK, cidr,
                                  is_default=True)
    tn = await changed(ctx, networks, cmd.tenant_id)
    await ctx.emit("network.network_created", c.NetworkCreated(
        tenant_id=cmd.tenant_id, network=find(tn, net.id), version=tn.version), tenant_id=cmd.tenant_id)
    return net


async def attach_step(networks: NetworkRepository, cmd: c.AttachNetwork, *, ctx: UnitOfWork, plan: NetworkPlan,
                      fabric: list[FabricDriver]) -> dict:
    """The attach step's effect (see the module docstring); returns the reply's fields. Raises StepRejected
    (``invoke``'s savepoint undoes what it wrote) when the network is unknown or something is exhausted."""
    await networks.lock_tenant(cmd.tenant_id)
    existing = await networks.attachment_for(cmd.allocation_id)
    if existing is not None:  # attached before (under another key, or by a concurrent attach that had the lock)
        return await _existing(networks, cmd, *existing)
    try:
        net = await _network(ctx, networks, cmd, plan)
    except Refused as exc:
        raise StepRejected(exc.reason) from None
    await networks.lock_network(net.id)
    ip = await networks.free_address(net.id, *slot_range(net.cidr), wanted_slot_address(net.cidr, cmd.ip_address))
    if ip is None:
        raise StepRejected(f"subnet exhausted: tenant network {net.id} (VNI {net.vni}, {net.cidr}) has no free address")
    attachment_id = uuid.uuid4()
    a = Attachment(attachment_id, cmd.allocation_id, net.id, net.vni, ip, mac_for(attachment_id), cmd.node_id,
                   guid_for(attachment_id), plan.leaves.leaf_of(cmd.node_id))
    await join_leaf(networks, a, cmd.tenant_id, ctx=ctx, plan=plan, fabric=fabric)
    return await _reply(networks, a, cmd.tenant_id, kept=_kept(cmd, a))


def _kept(cmd: c.AttachNetwork, a: Attachment) -> bool:
    """Whether ``a`` honours the address ``cmd`` asked for (true when it asked for none)."""
    return cmd.ip_address is None or cmd.ip_address == str(a.ip_address)


async def _existing(networks: NetworkRepository, cmd: c.AttachNetwork, a: Attachment, tenant_id: uuid.UUID) -> dict:
    """The answer to an attach of an allocation already attached: that attachment if it is on the node asked
    for; on another node it would be the wrong answer (the slot would be plumbed where it is not), and a second
    attachment would give the allocation two ports: the caller detaches it there first."""
    if a.node_id != cmd.node_id:
        raise StepRejected(f"allocation {cmd.allocation_id} is still attached on node {a.node_id}: "
                           f"detach it there before attaching it on node {cmd.node_id}")
    return await _reply(networks, a, tenant_id, kept=_kept(cmd, a))


async def detach_step(networks: NetworkRepository, cmd: c.DetachNetwork, *, ctx: UnitOfWork,
                      fabric: list[FabricDriver], plan: NetworkPlan) -> dict:
    """The detach step's effect (see the module docstring): idempotent, safe when nothing is attached."""
    found = await networks.attachment_for(cmd.allocation_id)
    if found is None:
        return {}
    await networks.lock_tenant(found[1])
    found = await networks.attachment_for(cmd.allocation_id)   # a concurrent detach may have won the lock
    if found is None:
        return {}
    a, tenant_id = found
    # a bare-metal server's port still on the tenant network goes back to the provisioning network first
    # (a reschedule's fence, a compensation): the port never stays on a VLAN nothing leases
    await unbind(networks, a.allocation_id, ctx=ctx, fabric=fabric, plan=plan)
    await leave_leaf(networks, a, tenant_id, ctx=ctx, fabric=fabric)
    return {}


async def attach_network(ctx: UnitOfWork, cmd: c.AttachNetwork, *, plan: NetworkPlan,
                         fabric: list[FabricDriver] = (), sim_faults: bool = False,
                         repository: RepositoryFactory = PgNetworkRepository) -> None:
    """Saga step: attach the allocation once per key; exhaustion or an unknown network → failure."""
    step = partial(attach_step, ctx=ctx, plan=plan, fabric=list(fabric))
    await invoke(ctx, cmd, over(repository, step), step=c.ATTACH_NETWORK, sim_faults=sim_faults, optimistic=True)


DEFAULT_PLAN = NetworkPlan()   # a detach needs the plan only for the provisioning VLAN a server's port returns to


async def detach_network(ctx: UnitOfWork, cmd: c.DetachNetwork, *, fabric: list[FabricDriver] = (),
                         plan: NetworkPlan = DEFAULT_PLAN, repository: RepositoryFactory = PgNetworkRepository) -> None:
    """Saga step or compensation: delete the allocation's attachment (idempotent; safe if there was none)."""
    step = partial(detach_step, ctx=ctx, fabric=list(fabric), plan=plan)
    await undo(ctx, cmd, over(repository, step), step=c.ATTACH_NETWORK)
