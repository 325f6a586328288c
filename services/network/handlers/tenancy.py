"""A tenant's networks inside one unit of work: provisioning from the pools, snapshots, releases.

Not a handler itself: what the attachment and management handlers share. Each reaches storage through the
``NetworkRepository`` port only.

Callers hold the tenant's lock (``NetworkRepository.lock_tenant``) first. Nothing here commits or publishes;
the ``changed`` helper queues the snapshot on the caller's outbox.
"""
from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Callable

import asyncpg

from services.network.contracts import NetworkSnapshot, SecurityRule, TenantNetworks
from shared.unit_of_work import UnitOfWork

from ..domain.model import IdPool, NetworkPlan, TenantNetwork, TenantResources
from ..domain.networks import Refused, check_new_network
from ..domain.ports import NetworkRepository

RepositoryFactory = Callable[[asyncpg.Connection], NetworkRepository]


async def _lease(networks: NetworkRepository, pool_name: str, pool: IdPool, owner: uuid.UUID, what: str) -> int:
    value = await networks.lease(pool_name, pool, owner)
    if value is None:
        raise Refused(f"{what} pool exhausted: all {pool.size} {what}s {pool.first}–{pool.last} are in use")
    return value


async def provision_network(networks: NetworkRepository, plan: NetworkPlan, tenant_id: uuid.UUID,
                            existing: list[TenantNetwork], network_id: uuid.UUID, name: str,
                            cidr: ipaddress.IPv4Network, *, is_default: bool = False) -> TenantNetwork:
    """Create the network with a VNI and a NAT address, and give the tenant its VRF id, PKey and L3 VNI
    if it has none; ``existing``: the tenant's networks, as the caller read them under the tenant's lock.
    Raises Refused (name taken, overlap, a pool exhausted); run it in a savepoint so a refusal leaves no
    lease behind."""
    check_new_network(name, cidr, existing)
    await networks.tenant(tenant_id)
    vrf = await _lease(networks, "vrf", plan.vrfs, tenant_id, "VRF table")
    pkey = await _lease(networks, "pkey", plan.pkeys, tenant_id, "PKey")
    l3_vni = await _lease(networks, "vni", plan.vnis, tenant_id, "VNI")
    vni = await _lease(networks, "vni", plan.vnis, network_id, "VNI")
    nat = await networks.lease("nat", plan.nats, network_id)
    if nat is None:
        raise Refused(f"NAT address pool exhausted: every address of {plan.nat_cidr} is in use")
    await networks.set_tenant_resources(tenant_id, vrf, pkey, l3_vni)
    net = TenantNetwork(network_id, tenant_id, vni, cidr, name, ipaddress.IPv4Address(nat))
    await networks.add_network(net, is_default=is_default)
    return net


async def release_tenant_if_empty(networks: NetworkRepository, tenant_id: uuid.UUID) -> bool:
    """Give back the tenant's VRF id, PKey and L3 VNI once it has no network (its version stays)."""
    if await networks.networks_of(tenant_id):
        return False
    await networks.release(tenant_id)
    await networks.set_tenant_resources(tenant_id, None, None, None)
    return True


def network_snapshot(net: TenantNetwork, res: TenantResources, rules: list[SecurityRule]) -> NetworkSnapshot:
    return NetworkSnapshot(network_id=net.id, name=net.name, vni=net.vni, cidr=str(net.cidr), gateway_ip=str(net.gateway),
                           nat_address=str(net.nat_address) if net.nat_address else None,
                           vrf_table=res.vrf_table or 1, rules=rules)


async def snapshot(networks: NetworkRepository, tenant_id: uuid.UUID) -> TenantNetworks:
    """ALL the tenant's networks with their rules, at the tenant's current version."""
    res = await networks.tenant(tenant_id)
    nets = await networks.networks_of(tenant_id)
    rules = await networks.rules_of([n.id for n in nets])
    return TenantNetworks(tenant_id=tenant_id, version=max(res.version, 1), pkey=res.pkey,
                          networks=[network_snapshot(n, res, rules[n.id]) for n in nets])


async def changed(ctx: UnitOfWork, networks: NetworkRepository, tenant_id: uuid.UUID) -> TenantNetworks:
    """Bump the tenant's version and queue ``network.tenant_networks_changed`` with the new snapshot."""
    await networks.bump_version(tenant_id)
    tn = await snapshot(networks, tenant_id)
    await ctx.emit("network.tenant_networks_changed", tn, tenant_id=tenant_id)
    return tn


def find(tn: TenantNetworks, network_id: uuid.UUID) -> NetworkSnapshot:
    return next(n for n in tn.networks if n.network_id == network_id)
