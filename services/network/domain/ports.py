"""The network service's port: what its handlers need from storage, stated without any (pure, no I/O).

``adapters.repository.PgNetworkRepository`` implements it on a unit of work's connection; the unit tests use an
in-memory fake. Nothing here commits: every change belongs to the caller's unit of work.

Locks, always taken in this order within a unit of work: the tenant's (``lock_tenant``), then pools (inside
``lease``: vrf, pkey, vni, nat, vlan:<leaf>), then network rows (``lock_network``), so concurrent units never
deadlock.
"""
from __future__ import annotations

import abc
import ipaddress
import uuid
from contextlib import AbstractAsyncContextManager

from ..contracts import SecurityRule
from .model import Attachment, IdPool, PortBinding, TenantNetwork, TenantResources


class NetworkRepository(abc.ABC):
    """Tenants with what they hold, their networks, security rules, slot attachments and pool leases."""

    @abc.abstractmethod
    def savepoint(self) -> AbstractAsyncContextManager[None]:
        """A block whose writes are all undone when it raises (the unit of work goes on)."""

    # --- locks ---------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def lock_tenant(self, tenant_id: uuid.UUID) -> None:
        """Serialise every change of one tenant's networks, rules and attachments until the unit of work ends
        (the call waits while another holds it)."""

    @abc.abstractmethod
    async def lock_network(self, network_id: uuid.UUID) -> None:
        """Lock the network until the unit of work ends: address assignment in it is serialised."""

    # --- pools ---------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def lease(self, pool_name: str, pool: IdPool, owner: uuid.UUID) -> int | None:
        """The value ``owner`` holds in the pool, leasing the lowest free one if it holds none; None when the
        pool is exhausted."""

    @abc.abstractmethod
    async def held(self, pool_name: str, owner: uuid.UUID) -> int | None:
        """The value ``owner`` holds in the pool, or None."""

    @abc.abstractmethod
    async def release(self, owner: uuid.UUID, pool_name: str | None = None) -> None:
        """Give back what ``owner`` holds (in one pool, or in all). Idempotent."""

    # --- tenants -------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def tenant(self, tenant_id: uuid.UUID) -> TenantResources:
        """The tenant's record (created, at version 0 and holding nothing, on first use)."""

    @abc.abstractmethod
    async def set_tenant_resources(self, tenant_id: uuid.UUID, vrf_table: int | None, pkey: int | None,
                                   l3_vni: int | None) -> None:
        """Record what the tenant holds (None: nothing)."""

    @abc.abstractmethod
    async def bump_version(self, tenant_id: uuid.UUID) -> TenantResources:
        """Grow the tenant's version by one; returns the record after it."""

    # --- networks ------------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def networks_of(self, tenant_id: uuid.UUID) -> list[TenantNetwork]:
        """The tenant's networks, oldest first."""

    @abc.abstractmethod
    async def network_exists(self, network_id: uuid.UUID) -> bool:
        """Whether a network of that id exists, whoever's it is."""

    @abc.abstractmethod
    async def add_network(self, net: TenantNetwork, *, is_default: bool = False) -> None:
        """Store a new network (its id unused)."""

    @abc.abstractmethod
    async def delete_network(self, network_id: uuid.UUID) -> None:
        """Delete the network, its rules and the rules naming it, and release what it leased (VNI, NAT address)."""

    # --- security rules ------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def rules_of(self, network_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[SecurityRule]]:
        """Each network's rules, oldest first (every id given is a key)."""

    @abc.abstractmethod
    async def rule(self, rule_id: uuid.UUID) -> tuple[uuid.UUID, SecurityRule] | None:
        """(network id, rule) of ``rule_id``, or None."""

    @abc.abstractmethod
    async def add_rule(self, network_id: uuid.UUID, rule: SecurityRule) -> None:
        """Store a new rule (its id unused) on the network."""

    @abc.abstractmethod
    async def delete_rule(self, rule_id: uuid.UUID) -> None:
        """Delete the rule (none: nothing happens)."""

    # --- attachments ---------------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def attachment_for(self, allocation_id: uuid.UUID) -> tuple[Attachment, uuid.UUID] | None:
        """(attachment, tenant id) of the allocation, or None."""

    @abc.abstractmethod
    async def add_attachment(self, attachment: Attachment) -> None:
        """Store the allocation's attachment (it has none)."""

    @abc.abstractmethod
    async def delete_attachment(self, allocation_id: uuid.UUID) -> None:
        """Delete the allocation's attachment (none: nothing happens)."""

    @abc.abstractmethod
    async def free_address(self, network_id: uuid.UUID, first: ipaddress.IPv4Address, last: ipaddress.IPv4Address,
                           wanted: ipaddress.IPv4Address | None) -> ipaddress.IPv4Address | None:
        """``domain.model.free_address`` over the addresses the network's attachments hold: ``wanted`` if none
        holds it, else the lowest address of [first, last] none holds; None when they hold them all."""

    @abc.abstractmethod
    async def count_attachments(self, network_id: uuid.UUID) -> int:
        """How many attachments the network has."""

    @abc.abstractmethod
    async def on_leaf(self, leaf: str, tenant_id: uuid.UUID, network_id: uuid.UUID) -> tuple[int, int, int]:
        """(attachments of the network on the leaf, attachments of any network of the tenant on the leaf,
        attachments of the tenant's networks anywhere)."""

    # --- bare-metal port bindings --------------------------------------------------------------------------------
    @abc.abstractmethod
    async def binding_for(self, allocation_id: uuid.UUID) -> PortBinding | None:
        """The allocation's port binding (its server's port is on its tenant network), or None."""

    @abc.abstractmethod
    async def port_holder(self, leaf: str, port: str) -> uuid.UUID | None:
        """The allocation whose binding holds the leaf's port, or None."""

    @abc.abstractmethod
    async def add_binding(self, binding: PortBinding) -> None:
        """Store the allocation's binding (it has none, and nobody holds the port)."""

    @abc.abstractmethod
    async def delete_binding(self, allocation_id: uuid.UUID) -> None:
        """Delete the allocation's binding (none: nothing happens)."""

    @abc.abstractmethod
    async def rehome(self, allocation_id: uuid.UUID, leaf: str) -> None:
        """Record that the allocation's attachment is served by ``leaf``."""
