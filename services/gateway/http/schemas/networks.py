"""HTTP models of tenant networks: networks, their security rules and attachments.

A subnet is checked with the network service's own rule (``cidr_problem``, from its contracts).
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from services.network.contracts import cidr_problem

from .base import Body, Out, ResourceName


class NetworkCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"id", "tenant_id", "state", "gateway_ip", "nat_address", "reason", "rules", "created_at", "updated_at", "links"})
    name: ResourceName
    cidr: str = Field(max_length=18, description="IPv4 subnet from /16 to /29, e.g. 10.1.0.0/24; must not overlap "
                                                 "another network of the tenant.")

    @field_validator("cidr")
    @classmethod
    def _subnet(cls, value: str) -> str:
        problem = cidr_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class RuleCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"id", "network_id", "state", "reason", "created_at"})
    direction: Literal["ingress", "egress"]
    protocol: Literal["tcp", "udp", "icmp", "any"] = "tcp"
    port_from: int | None = Field(default=None, ge=1, le=65535)
    port_to: int | None = Field(default=None, ge=1, le=65535, description="With port_from: a range.")
    remote_network_id: uuid.UUID | None = Field(default=None, strict=False,
                                                description="Ingress: another network of the tenant.")
    remote_cidr: str | None = Field(default=None, max_length=18, description="Egress: an outside IPv4 CIDR.")


class RuleOut(Out):
    """A security rule and where it stands (adding, active, removing, rejected with reason)."""

    id: uuid.UUID
    network_id: uuid.UUID
    direction: str
    protocol: str
    port_from: int | None
    port_to: int | None
    remote_network_id: uuid.UUID | None
    remote_cidr: str | None
    state: Literal["adding", "active", "removing", "rejected"]
    reason: str | None
    created_at: datetime


class NetworkOut(Out):
    """A tenant network: creating, active, deleting, deleted, or rejected (with the reason)."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    cidr: str
    state: Literal["creating", "active", "deleting", "deleted", "rejected"]
    gateway_ip: str | None = Field(description="The subnet's first host, once active.")
    nat_address: str | None = Field(description="The network's north-south NAT address, once active.")
    reason: str | None
    rules: list[RuleOut]
    created_at: datetime
    updated_at: datetime
    links: dict[str, str]


class NetworkList(Out):
    """The tenant's networks (deleted ones left out), oldest first."""

    items: list[NetworkOut]


class AttachmentOut(Out):
    """One allocation's interface on the network."""

    allocation_id: uuid.UUID
    attachment_id: uuid.UUID
    ip_address: str
    prefix_len: int
    mac_address: str
    node_id: uuid.UUID | None
    attached_at: datetime


class AttachmentList(Out):
    """The network's current attachments, by address."""

    items: list[AttachmentOut]
