"""Network's handlers: attach an allocation to its tenant's default network (saga step), detach it (undo).

Two locks keep addressing unique under concurrency: creating a tenant network
takes the VNI-pool advisory lock (so the "lowest free VNI" is chosen by one
transaction at a time), and assigning an address locks the network's row (so
the "lowest free host" is too). The unique constraints back both up.
"""
from __future__ import annotations

import uuid
from functools import partial

import asyncpg

from shared.consumer import HandlerContext
from shared.participant import StepRejected, invoke, undo

from . import contracts as c
from .adapters import repository
from .domain.model import Attachment, NetworkPlan, TenantNetwork, lowest_free_host, mac_for


def _reply(a: Attachment) -> dict:
    return {"attachment_id": a.id, "vni": a.vni, "ip_address": str(a.ip_address), "mac_address": a.mac_address}


async def _default_network(conn: asyncpg.Connection, tenant_id: uuid.UUID, plan: NetworkPlan) -> TenantNetwork:
    """The tenant's default network, created on first use. Raises StepRejected if the VNI pool is exhausted."""
    net = await repository.default_network(conn, tenant_id)
    if net is not None:
        return net
    await repository.lock_vni_pool(conn)
    net = await repository.default_network(conn, tenant_id)   # created by a transaction we waited for?
    if net is not None:
        return net
    vni = plan.vnis.lowest_free(await repository.used_vnis(conn, plan.vnis))
    if vni is None:
        raise StepRejected(f"VNI pool exhausted: all {plan.vnis.size} VNIs {plan.vnis.first}–{plan.vnis.last} are in use")
    net = TenantNetwork(uuid.uuid4(), tenant_id, vni, plan.tenant_cidr)
    await repository.add_network(conn, net)
    return net


async def _attach(conn: asyncpg.Connection, cmd: c.AttachNetwork, *, plan: NetworkPlan) -> dict:
    existing = await repository.attachment_for(conn, cmd.allocation_id)
    if existing is not None:  # attached before under another key: the same answer, no second address
        return _reply(existing)
    net = await _default_network(conn, cmd.tenant_id, plan)
    await repository.lock_network(conn, net.id)
    ip = lowest_free_host(net.cidr, await repository.used_addresses(conn, net.id))
    if ip is None:
        raise StepRejected(f"subnet exhausted: tenant network {net.id} (VNI {net.vni}, {net.cidr}) has no free address")
    attachment_id = uuid.uuid4()
    attachment = Attachment(attachment_id, cmd.allocation_id, net.id, net.vni, ip, mac_for(attachment_id), cmd.node_id)
    await repository.add_attachment(conn, attachment)
    return _reply(attachment)


async def _detach(conn: asyncpg.Connection, cmd: c.DetachNetwork) -> dict:
    await repository.delete_attachment(conn, cmd.allocation_id)
    return {}


async def attach_network(ctx: HandlerContext, cmd: c.AttachNetwork, *, plan: NetworkPlan, sim_faults: bool = False) -> None:
    """Saga step: give the allocation an address on its tenant network, once per key; exhaustion → failure."""
    await invoke(ctx, cmd, partial(_attach, plan=plan), succeeded="network.network_attached",
                 failed="network.network_attach_failed", reply_model=c.NetworkAttached,
                 failure_model=c.NetworkAttachFailed, sim_faults=sim_faults)


async def detach_network(ctx: HandlerContext, cmd: c.DetachNetwork) -> None:
    """Saga step or compensation: delete the allocation's attachment (idempotent; safe if there was none)."""
    await undo(ctx, cmd, _detach, undone="network.network_detached", reply_model=c.NetworkDetached)
