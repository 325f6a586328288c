"""The tenant network state a node needs, as the network service publishes it (issue 4).

The network service owns these models (it fills them); the saga carries the
snapshot from the attach reply to the node-agent's provision command, and the
node-agent also receives every later change as ``network.tenant_networks_changed``.
A snapshot always holds ALL networks of one tenant (a node routes between a
tenant's networks, so it needs each of them), and ``version`` only grows: a
node-agent keeps the highest version it has seen per tenant.

Cross-tenant rules cannot be expressed: a rule's remote is either another
network of the same tenant (``remote_network_id``) or, for egress only, an
outside CIDR reached through the NAT gateway.
"""
from __future__ import annotations

import uuid
from typing import Literal

from pydantic import Field

from shared.wire import Wire


class SecurityRule(Wire):
    id: uuid.UUID
    direction: Literal["ingress", "egress"]
    protocol: Literal["tcp", "udp", "icmp", "any"] = "tcp"
    port_from: int | None = Field(default=None, ge=1, le=65535)
    port_to: int | None = Field(default=None, ge=1, le=65535)
    remote_network_id: uuid.UUID | None = Field(default=None, description="Another network of the same tenant.")
    remote_cidr: str | None = Field(default=None, description="Egress only: an outside CIDR (through the NAT gateway).")


class NetworkSnapshot(Wire):
    network_id: uuid.UUID
    name: str
    vni: int = Field(ge=1, le=16_777_215)
    cidr: str
    gateway_ip: str = Field(description="The subnet's first host: the tenant router's leg on this network.")
    nat_address: str | None = Field(default=None, description="The network's north-south NAT gateway address.")
    vrf_table: int = Field(ge=1, description="Route-table / VRF id of the tenant (the fabric's L3 VNI context).")
    rules: list[SecurityRule] = Field(default_factory=list)


class TenantNetworks(Wire):
    tenant_id: uuid.UUID
    version: int = Field(ge=1)
    pkey: int | None = Field(default=None, ge=1, le=0x7FFF, description="InfiniBand partition key of the tenant.")
    networks: list[NetworkSnapshot]


class SlotAttachment(Wire):
    """One allocation's interface on a tenant network (what the node plumbs)."""

    attachment_id: uuid.UUID
    allocation_id: uuid.UUID
    network_id: uuid.UUID
    ip_address: str
    prefix_len: int = Field(ge=8, le=30)
    mac_address: str
