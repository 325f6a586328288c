"""Security rules of a tenant network (pure, no I/O).

Default policy: traffic within a network is allowed; everything else into it is denied.
A rule opens one more path:

- ``ingress`` from ``remote_network_id``, another network of the SAME tenant (protocol and
  optionally one port or a port range);
- ``egress`` to ``remote_cidr``, an outside CIDR reached through the network's NAT gateway.
  Egress rules are an allow-list: once a network has one, its slots reach the outside only
  where its egress rules allow.

A rule naming another tenant's network is refused with the same reason as a network
that does not exist, so a cross-tenant rule cannot be expressed and nothing leaks.
"""
from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Iterable

from shared.netwire import SecurityRule

from .model import TenantNetwork
from .networks import Refused, owned

MAX_RULES_PER_NETWORK = 128
PORTED = ("tcp", "udp")


def _port_problems(protocol: str, port_from: int | None, port_to: int | None) -> list[tuple[str, str]]:
    if protocol not in PORTED:
        return [(f, f"{protocol} has no ports; leave it out") for f, v in (("port_from", port_from), ("port_to", port_to))
                if v is not None]
    if port_to is not None and port_from is None:
        return [("port_from", "a port range needs port_from")]
    if port_to is not None and port_to < port_from:
        return [("port_to", f"must be ≥ port_from ({port_from})")]
    return []


def _remote_problems(direction: str, remote_network_id: uuid.UUID | None, remote_cidr: str | None) -> list[tuple[str, str]]:
    if direction == "ingress":
        problems = [] if remote_network_id else [("remote_network_id", "an ingress rule names the tenant network it allows")]
        if remote_cidr is not None:
            problems.append(("remote_cidr", "ingress from outside is never allowed; only egress rules take a CIDR"))
        return problems
    problems = [("remote_network_id", "egress rules name an outside CIDR, not a network")] if remote_network_id else []
    if remote_cidr is None:
        return problems + [("remote_cidr", "an egress rule names the outside CIDR it allows")]
    try:
        ipaddress.IPv4Network(remote_cidr, strict=True)
    except (ValueError, TypeError):
        problems.append(("remote_cidr", f"{remote_cidr!r} is not an IPv4 CIDR without host bits, e.g. 203.0.113.0/24"))
    return problems


def rule_problems(direction: str, protocol: str, port_from: int | None, port_to: int | None,
                  remote_network_id: uuid.UUID | None, remote_cidr: str | None) -> list[tuple[str, str]]:
    """(field, message) for each thing wrong with a rule's shape; empty when well formed.
    Ownership of the remote network is checked by ``check_rule``, which knows the tenant."""
    return _port_problems(protocol, port_from, port_to) + _remote_problems(direction, remote_network_id, remote_cidr)


def _same(a: SecurityRule, b: SecurityRule) -> bool:
    keys = ("direction", "protocol", "port_from", "port_to", "remote_network_id", "remote_cidr")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def check_rule(network_id: uuid.UUID, rule: SecurityRule, tenant_networks: Iterable[TenantNetwork],
               existing: list[SecurityRule]) -> None:
    """Raises Refused unless ``rule`` may be added to the tenant's network ``network_id``.

    ``tenant_networks`` are ALL the networks of the requesting tenant; ``existing`` the
    network's current rules. A rule whose id is already there is NOT refused here (the
    caller treats it as a repeat)."""
    networks = list(tenant_networks)
    owned(network_id, networks)
    problems = rule_problems(rule.direction, rule.protocol, rule.port_from, rule.port_to,
                             rule.remote_network_id, rule.remote_cidr)
    if problems:
        raise Refused("; ".join(f"{f}: {m}" for f, m in problems))
    if rule.remote_network_id is not None:
        try:
            owned(rule.remote_network_id, networks)
        except Refused:
            raise Refused(f"remote_network_id: {rule.remote_network_id}: network not found") from None
        if rule.remote_network_id == network_id:
            raise Refused("remote_network_id: traffic within a network is always allowed; name another network")
    if any(_same(rule, r) for r in existing):
        raise Refused("an identical rule already exists on this network")
    if len(existing) >= MAX_RULES_PER_NETWORK:
        raise Refused(f"a network has at most {MAX_RULES_PER_NETWORK} rules")
