"""The network service's repository port over dicts (no I/O), and a fabric driver that keeps its calls.

FakeNetworkRepository  what the asyncpg repository stores, in memory; ``snapshot``/``restore`` make its
                       savepoints (and a StepConnection's) undo what a refused block wrote
RecordingFabric        the EVPN driver's renderer, its sent calls kept in ``sent`` as (action, call)
"""
from __future__ import annotations

import dataclasses
import ipaddress
import uuid
from typing import Any

from services.network.adapters.fabric import EvpnNvueDriver, FabricCall, FabricChange
from services.network.contracts import SecurityRule
from services.network.domain import model
from services.network.domain.model import Attachment, IdPool, PortBinding, TenantNetwork, TenantResources
from services.network.domain.ports import NetworkRepository
from tests.support.steps import Snapshots


class FakeNetworkRepository(Snapshots, NetworkRepository):
    unsaved = ("locked",)    # the order tenants were locked in stays what the test saw

    def __init__(self) -> None:
        self.tenants: dict[uuid.UUID, TenantResources] = {}
        self.networks: dict[uuid.UUID, TenantNetwork] = {}          # in creation order
        self.defaults: set[uuid.UUID] = set()
        self.rules: dict[uuid.UUID, tuple[uuid.UUID, SecurityRule]] = {}
        self.attachments: dict[uuid.UUID, Attachment] = {}          # by allocation
        self.leases: dict[tuple[str, int], uuid.UUID] = {}          # (pool, value) -> owner
        self.locked: list[uuid.UUID] = []                            # tenants, in the order locked
        self.bindings: dict[uuid.UUID, PortBinding] = {}              # by allocation

    async def lock_tenant(self, tenant_id: uuid.UUID) -> None:
        self.locked.append(tenant_id)

    async def lock_network(self, network_id: uuid.UUID) -> None:
        pass

    async def lease(self, pool_name: str, pool: IdPool, owner: uuid.UUID) -> int | None:
        value = await self.held(pool_name, owner)
        if value is None:
            value = pool.lowest_free(v for p, v in self.leases if p == pool_name)
            if value is not None:
                self.leases[(pool_name, value)] = owner
        return value

    async def held(self, pool_name: str, owner: uuid.UUID) -> int | None:
        return next((v for (p, v), o in self.leases.items() if p == pool_name and o == owner), None)

    async def release(self, owner: uuid.UUID, pool_name: str | None = None) -> None:
        self.leases = {k: o for k, o in self.leases.items() if o != owner or pool_name not in (None, k[0])}

    async def tenant(self, tenant_id: uuid.UUID) -> TenantResources:
        return self.tenants.setdefault(tenant_id, TenantResources(tenant_id, 0, None, None, None))

    async def set_tenant_resources(self, tenant_id, vrf_table, pkey, l3_vni) -> None:
        self.tenants[tenant_id] = TenantResources(tenant_id, self.tenants[tenant_id].version, vrf_table, pkey, l3_vni)

    async def bump_version(self, tenant_id: uuid.UUID) -> TenantResources:
        t = self.tenants[tenant_id]
        self.tenants[tenant_id] = TenantResources(tenant_id, t.version + 1, t.vrf_table, t.pkey, t.l3_vni)
        return self.tenants[tenant_id]

    async def networks_of(self, tenant_id: uuid.UUID) -> list[TenantNetwork]:
        return [n for n in self.networks.values() if n.tenant_id == tenant_id]

    async def network_exists(self, network_id: uuid.UUID) -> bool:
        return network_id in self.networks

    async def add_network(self, net: TenantNetwork, *, is_default: bool = False) -> None:
        assert net.id not in self.networks, f"network {net.id} exists already"
        self.networks[net.id] = net
        if is_default:
            self.defaults.add(net.id)

    async def delete_network(self, network_id: uuid.UUID) -> None:
        self.networks.pop(network_id, None)
        self.rules = {k: (n, r) for k, (n, r) in self.rules.items()
                      if network_id not in (n, r.remote_network_id)}
        await self.release(network_id)

    async def rules_of(self, network_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[SecurityRule]]:
        return {n: [r for owner, r in self.rules.values() if owner == n] for n in network_ids}

    async def rule(self, rule_id: uuid.UUID) -> tuple[uuid.UUID, SecurityRule] | None:
        return self.rules.get(rule_id)

    async def add_rule(self, network_id: uuid.UUID, rule: SecurityRule) -> None:
        assert rule.id not in self.rules, f"rule {rule.id} exists already"
        self.rules[rule.id] = (network_id, rule)

    async def delete_rule(self, rule_id: uuid.UUID) -> None:
        self.rules.pop(rule_id, None)

    async def attachment_for(self, allocation_id: uuid.UUID) -> tuple[Attachment, uuid.UUID] | None:
        a = self.attachments.get(allocation_id)
        return None if a is None else (a, self.networks[a.network_id].tenant_id)

    async def add_attachment(self, attachment: Attachment) -> None:
        assert attachment.allocation_id not in self.attachments, "the allocation is attached already"
        self.attachments[attachment.allocation_id] = attachment

    async def delete_attachment(self, allocation_id: uuid.UUID) -> None:
        self.attachments.pop(allocation_id, None)

    def _used(self, network_id: uuid.UUID) -> list[ipaddress.IPv4Address]:
        return [a.ip_address for a in self.attachments.values() if a.network_id == network_id]

    async def free_address(self, network_id: uuid.UUID, first: ipaddress.IPv4Address, last: ipaddress.IPv4Address,
                           wanted: ipaddress.IPv4Address | None) -> ipaddress.IPv4Address | None:
        return model.free_address(first, last, wanted, self._used(network_id))

    async def count_attachments(self, network_id: uuid.UUID) -> int:
        return len(self._used(network_id))

    def _of_tenant(self, tenant_id: uuid.UUID) -> list[Attachment]:
        return [a for a in self.attachments.values() if self.networks[a.network_id].tenant_id == tenant_id]

    async def on_leaf(self, leaf: str, tenant_id: uuid.UUID, network_id: uuid.UUID) -> tuple[int, int, int]:
        everywhere = self._of_tenant(tenant_id)
        here = [a for a in everywhere if a.leaf == leaf]
        return sum(a.network_id == network_id for a in here), len(here), len(everywhere)

    async def binding_for(self, allocation_id: uuid.UUID) -> PortBinding | None:
        return self.bindings.get(allocation_id)

    async def port_holder(self, leaf: str, port: str) -> uuid.UUID | None:
        return next((b.allocation_id for b in self.bindings.values() if (b.leaf, b.port) == (leaf, port)), None)

    async def add_binding(self, binding: PortBinding) -> None:
        self.bindings[binding.allocation_id] = binding

    async def delete_binding(self, allocation_id: uuid.UUID) -> None:
        self.bindings.pop(allocation_id, None)

    async def rehome(self, allocation_id: uuid.UUID, leaf: str) -> None:
        self.attachments[allocation_id] = dataclasses.replace(self.attachments[allocation_id], leaf=leaf)


class RecordingFabric(EvpnNvueDriver):
    """The EVPN driver whose ``send`` keeps the calls instead of writing them to the database."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, FabricCall]] = []

    async def send(self, conn: Any, action: str, change: FabricChange, calls: list[FabricCall]) -> None:
        self.sent += [(action, call) for call in calls]
