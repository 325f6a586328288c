"""What a tenant may ask of its networks: names, subnets and overlap (pure, no I/O).

A tenant's networks are joined by the tenant's router (its VRF), so within one
tenant two networks must not overlap; across tenants anything goes (each tenant's
VNIs and VRF isolate it). Every refusal is a ``Refused`` with a reason a person can
act on; a network of another tenant is reported exactly like one that does not exist.
"""
from __future__ import annotations

import ipaddress
import re
import uuid
from collections.abc import Iterable

from ..contracts import cidr_problem
from .model import TenantNetwork

NETWORK_NOT_FOUND = "network not found"
NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


class Refused(Exception):
    """A tenant's request that cannot be granted; ``reason`` says why (nothing was changed)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def parse_cidr(text: str) -> ipaddress.IPv4Network:
    """The subnet ``text`` names; raises Refused (see ``cidr_problem``)."""
    problem = cidr_problem(text)
    if problem:
        raise Refused(f"cidr: {problem}")
    return ipaddress.IPv4Network(text.strip())


def check_name(name: str) -> None:
    if not NAME.match(name or ""):
        raise Refused(f"name: {name!r} must be 1–63 letters, digits, '.', '_' or '-', starting and ending alphanumeric")


def check_new_network(name: str, cidr: ipaddress.IPv4Network, existing: Iterable[TenantNetwork]) -> None:
    """Raises Refused if the tenant already has a network of that name or one overlapping ``cidr``."""
    check_name(name)
    for net in existing:
        if net.name == name:
            raise Refused(f"name: the tenant already has a network named {name!r}")
        if net.cidr.overlaps(cidr):
            raise Refused(f"cidr: {cidr} overlaps {net.cidr} of network {net.name!r} ({net.id}); "
                          f"a tenant's networks are routed together, so they must not overlap")


def owned(network_id: uuid.UUID, networks: Iterable[TenantNetwork]) -> TenantNetwork:
    """The tenant's network ``network_id``; raises Refused('network not found') otherwise (another
    tenant's network included: nothing about other tenants leaks)."""
    for net in networks:
        if net.id == network_id:
            return net
    raise Refused(NETWORK_NOT_FOUND)
