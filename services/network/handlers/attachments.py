"""Saga steps: attach an allocation to a network of its tenant, detach it (undo).

Attach takes the tenant's lock, picks the named network (one of another tenant is "network
not found") or the tenant's "default" network (created on first use), gives the slot the
network's lowest free host after the gateway, a MAC and an InfiniBand GUID derived from the
attachment id, and a leaf-local VLAN on the leaf serving the node; then every fabric driver
renders and sends its calls, all in the step's transaction. Detach undoes exactly that and
releases the address, the VLAN when the network's last slot leaves the leaf, and the fabric
config that only this slot needed.
"""
from __future__ import annotations

import uuid
from functools import partial

import asyncpg

from shared.unit_of_work import UnitOfWork
from services.network.contracts import SlotAttachment
from shared.participant import StepRejected, invoke, undo

from .. import contracts as c
from . import tenancy
from ..adapters import attachments as att
from ..adapters import repository as repo
from ..adapters.fabric import FabricChange, FabricDriver
from ..domain.model import (
    DEFAULT_NETWORK,
    Attachment,
    NetworkPlan,
    TenantNetwork,
    VlanPool,
    guid_for,
    lowest_free_slot_address,
    mac_for,
)
from ..domain.networks import Refused, owned


async def _reply(conn: asyncpg.Connection, a: Attachment, tenant_id: uuid.UUID) -> dict:
    net = next(n for n in await repo.networks_of(conn, tenant_id) if n.id == a.network_id)
    slot = SlotAttachment(attachment_id=a.id, allocation_id=a.allocation_id, network_id=a.network_id,
                          ip_address=str(a.ip_address), prefix_len=net.cidr.prefixlen, mac_address=a.mac_address)
    tn = await tenancy.snapshot(conn, tenant_id)
    return {"attachment_id": a.id, "vni": a.vni, "ip_address": str(a.ip_address), "mac_address": a.mac_address,
            "node_id": a.node_id, "attachment": slot.model_dump(mode="json"), "tenant_networks": tn.model_dump(mode="json")}


async def _network(ctx: UnitOfWork, cmd: c.AttachNetwork, plan: NetworkPlan) -> TenantNetwork:
    """The network to attach to; the tenant's default network is created (and announced) on first use."""
    nets = await repo.networks_of(ctx.conn, cmd.tenant_id)
    if cmd.network_id is not None:
        return owned(cmd.network_id, nets)
    for net in nets:
        if net.name == DEFAULT_NETWORK:
            return net
    net = await tenancy.provision_network(ctx.conn, plan, cmd.tenant_id, uuid.uuid4(), DEFAULT_NETWORK,
                                          plan.tenant_cidr, is_default=True)
    tn = await tenancy.changed(ctx, cmd.tenant_id)
    await ctx.emit("network.network_created", c.NetworkCreated(
        tenant_id=cmd.tenant_id, network=tenancy.find(tn, net.id), version=tn.version), tenant_id=cmd.tenant_id)
    return net


async def _change(conn: asyncpg.Connection, a: Attachment, tenant_id: uuid.UUID, vlan: int) -> FabricChange:
    """The fabric's view of ``a``; call it while ``a`` is not in the table (before the insert, after the delete)."""
    on_network, on_tenant = await att.on_leaf(conn, a.leaf, tenant_id, a.network_id)
    total = await att.tenant_attachment_count(conn, tenant_id)
    res = await repo.tenant(conn, tenant_id)
    net = next(n for n in await repo.networks_of(conn, tenant_id) if n.id == a.network_id)
    return FabricChange(tenant_id=tenant_id, network_id=net.id, vni=net.vni, cidr=net.cidr, gateway_ip=net.gateway,
                        vrf_table=res.vrf_table, l3_vni=res.l3_vni, pkey=res.pkey, allocation_id=a.allocation_id,
                        guid=a.guid, node_id=a.node_id, leaf=a.leaf, vlan=vlan, network_alone_on_leaf=on_network == 0,
                        tenant_alone_on_leaf=on_tenant == 0, tenant_alone=total == 0)


async def _attach(conn: asyncpg.Connection, cmd: c.AttachNetwork, *, ctx: UnitOfWork, plan: NetworkPlan,
                  fabric: list[FabricDriver]) -> dict:
    existing = await att.attachment_for(conn, cmd.allocation_id)
    if existing is not None:  # attached before under another key: the same answer, no second address
        return await _reply(conn, *existing)
    await repo.lock_tenant(conn, cmd.tenant_id)
    existing = await att.attachment_for(conn, cmd.allocation_id)   # a concurrent attach may have won the lock
    if existing is not None:
        return await _reply(conn, *existing)
    try:
        net = await _network(ctx, cmd, plan)
    except Refused as exc:
        raise StepRejected(exc.reason) from None
    await repo.lock_network(conn, net.id)
    ip = lowest_free_slot_address(net.cidr, await att.used_addresses(conn, net.id))
    if ip is None:
        raise StepRejected(f"subnet exhausted: tenant network {net.id} (VNI {net.vni}, {net.cidr}) has no free address")
    leaf = plan.leaves.leaf_of(cmd.node_id)
    vlan = await repo.lease(conn, f"vlan:{leaf}", VlanPool(), net.id)
    if vlan is None:
        raise StepRejected(f"leaf {leaf} has no free VLAN for network {net.id}")
    attachment_id = uuid.uuid4()
    a = Attachment(attachment_id, cmd.allocation_id, net.id, net.vni, ip, mac_for(attachment_id), cmd.node_id,
                   guid_for(attachment_id), leaf)
    change = await _change(conn, a, cmd.tenant_id, vlan)
    await att.add_attachment(conn, a)
    for driver in fabric:
        await driver.apply(conn, "attach", change)
    return await _reply(conn, a, cmd.tenant_id)


async def _detach(conn: asyncpg.Connection, cmd: c.DetachNetwork, *, fabric: list[FabricDriver]) -> dict:
    found = await att.attachment_for(conn, cmd.allocation_id)
    if found is None:
        return {}
    await repo.lock_tenant(conn, found[1])
    found = await att.attachment_for(conn, cmd.allocation_id)   # a concurrent detach may have won the lock
    if found is None:
        return {}
    a, tenant_id = found
    await att.delete_attachment(conn, a.allocation_id)
    if a.leaf:   # attachments from before the fabric existed have no leaf and no VLAN
        vlan = await repo.held(conn, f"vlan:{a.leaf}", a.network_id) or 0
        change = await _change(conn, a, tenant_id, vlan)
        if change.network_alone_on_leaf:
            await repo.release(conn, a.network_id, f"vlan:{a.leaf}")
        for driver in fabric:
            await driver.apply(conn, "detach", change)
    return {}


async def attach_network(ctx: UnitOfWork, cmd: c.AttachNetwork, *, plan: NetworkPlan,
                         fabric: list[FabricDriver] = (), sim_faults: bool = False) -> None:
    """Saga step: attach the allocation once per key; exhaustion or an unknown network → failure."""
    await invoke(ctx, cmd, partial(_attach, ctx=ctx, plan=plan, fabric=list(fabric)),
                 step=c.ATTACH_NETWORK, sim_faults=sim_faults)


async def detach_network(ctx: UnitOfWork, cmd: c.DetachNetwork, *, fabric: list[FabricDriver] = ()) -> None:
    """Saga step or compensation: delete the allocation's attachment (idempotent; safe if there was none)."""
    await undo(ctx, cmd, partial(_detach, fabric=list(fabric)), step=c.ATTACH_NETWORK)
