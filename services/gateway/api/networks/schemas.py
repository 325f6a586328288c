"""HTTP models of tenant networks: networks, their security rules and attachments.

A subnet is checked with the network service's own rule (``cidr_problem``, from its contracts), and with the
pattern the OpenAPI document states (``ipv4_network_pattern``: the same rule, spelled as a regular expression).
"""
from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field

from services.network.contracts import MAX_PREFIX, MIN_PREFIX, PORTED, UNUSABLE_PATTERN, cidr_problem

from ...http.schema_base import Body, Explained, Out, ResourceName, Uuid, constraints, integer, text

# an octet (0-255, no leading zeros) whose low bits are zero, by how many: compact forms for 0, 1 and 2 bits
_OCTETS = {0: "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
           1: "(?:25[024]|2[0-4][02468]|1[0-9][02468]|[1-9][02468]|[02468])",
           2: "(?:252|2[024][048]|2[13][26]|1[02468][048]|1[13579][26]|[2468][048]|[13579][26]|[048])"}


def _octet(network_bits: int) -> str:
    """An octet with ``network_bits`` leading bits free and the rest zero."""
    zero_bits = 8 - min(network_bits, 8)
    if zero_bits in _OCTETS:
        return _OCTETS[zero_bits]
    return "(?:" + "|".join(str(v) for v in range(0, 256, 1 << zero_bits)) + ")"


def ipv4_network_pattern(min_prefix: int, max_prefix: int) -> str:
    """``a.b.c.d/p`` with ``min_prefix <= p <= max_prefix`` and no host bits set (what ``ipaddress.IPv4Network(...,
    strict=True)`` accepts written that way), as an ECMA-262 / Python regular expression: the prefixes grouped by
    how many whole octets they free, e.g. ``O.O.O.(?:0/24|(?:0|128)/25|...)``."""
    groups = []
    for whole in range(5):
        prefixes = [p for p in range(min_prefix, max_prefix + 1) if p // 8 == whole]
        if not prefixes:
            continue
        head = [_OCTETS[0]] * whole
        if whole == 4:
            groups.append(r"\.".join(head) + "/32")
            continue
        tails = [r"\.".join([_octet(p - 8 * whole)] + ["0"] * (3 - whole)) + f"/{p}" for p in prefixes]
        groups.append("".join(h + r"\." for h in head) + "(?:" + "|".join(tails) + ")")
    return "^(?:" + "|".join(groups) + ")$"


def _outside_cidr_problem(value: str) -> str | None:
    if not re.fullmatch(REMOTE_CIDR_PATTERN, value):
        return f"{value!r} is not an IPv4 CIDR without host bits, e.g. 203.0.113.0/24"
    return None


SUBNET_PATTERN = ipv4_network_pattern(MIN_PREFIX, MAX_PREFIX)
REMOTE_CIDR_PATTERN = ipv4_network_pattern(0, 32)
Subnet = Annotated[text(18, min_length=9), Explained(SUBNET_PATTERN, cidr_problem, "cidr")]
OutsideCidr = Annotated[text(18, min_length=9), Explained(REMOTE_CIDR_PATTERN, _outside_cidr_problem, "cidr")]
Port = integer(1, 65535)


class NetworkCreate(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset(
        {"id", "tenant_id", "state", "gateway_ip", "nat_address", "reason", "rules", "created_at", "updated_at", "links"})
    name: ResourceName
    cidr: Subnet = Field(description=f"IPv4 subnet from /{MIN_PREFIX} to /{MAX_PREFIX} without host bits, e.g. "
                                     "10.1.0.0/24, that a host can use: not in 0.0.0.0/8, loopback (127.0.0.0/8), "
                                     "link-local (169.254.0.0/16), multicast (224.0.0.0/4) or reserved "
                                     "(240.0.0.0/4). Private (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, "
                                     "100.64.0.0/10) unless the provider allows public subnets (else a 422). Must not "
                                     "overlap another network of the tenant (a 409 naming the other one).",
                         json_schema_extra={"not": {"pattern": UNUSABLE_PATTERN}})


# The shape rules of services.network.contracts.rule_problems, as JSON Schema states them (port_to not below
# port_from, which JSON Schema cannot compare, as an x-constraints rule).
_RULE_RULES = {**constraints("port_from <= port_to"), "allOf": [
    {"if": {"properties": {"direction": {"const": "ingress"}}, "required": ["direction"]},
     "then": {"properties": {"remote_network_id": {"type": "string"}, "remote_cidr": {"type": "null"}},
              "required": ["remote_network_id"]},
     "else": {"properties": {"remote_network_id": {"type": "null"}, "remote_cidr": {"type": "string"}},
              "required": ["remote_cidr"]}},
    {"if": {"properties": {"protocol": {"not": {"enum": list(PORTED)}}}, "required": ["protocol"]},
     "then": {"properties": {"port_from": {"type": "null"}, "port_to": {"type": "null"}}}},
    {"if": {"properties": {"port_to": {"type": "integer"}}, "required": ["port_to"]},
     "then": {"properties": {"port_from": {"type": "integer"}}, "required": ["port_from"]}},
]}


class RuleCreate(Body):
    """Ingress rules name another network of the tenant (remote_network_id), egress rules an outside CIDR
    (remote_cidr); only tcp and udp rules have ports, and port_to (a range) needs port_from and is not below it."""

    server_owned: ClassVar[frozenset[str]] = frozenset({"id", "network_id", "state", "reason", "created_at"})
    model_config = ConfigDict(json_schema_extra=_RULE_RULES)
    direction: Literal["ingress", "egress"]
    protocol: Literal["tcp", "udp", "icmp", "any"] = "tcp"
    port_from: Port | None = None
    port_to: Port | None = Field(default=None, description="With port_from: a range (not below it).")
    remote_network_id: Uuid | None = Field(default=None, description="Ingress: another network of the tenant.")
    remote_cidr: OutsideCidr | None = Field(default=None, description="Egress: an outside IPv4 CIDR without host bits.")


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
