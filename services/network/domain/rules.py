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

import uuid
from collections.abc import Iterable

from ..contracts import SecurityRule, rule_problems
from .model import TenantNetwork
from .networks import Refused, owned

MAX_RULES_PER_NETWORK = 128


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
