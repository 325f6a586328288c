"""Tenant subnets (choice, overlap) and security-rule validation (pure domain, no I/O)."""
from __future__ import annotations

import ipaddress
import uuid

import pytest

from services.network.contracts import SecurityRule, cidr_problem, rule_problems
from services.network.domain.model import TenantNetwork
from services.network.domain.networks import NETWORK_NOT_FOUND, Refused, check_new_network, owned, parse_cidr
from services.network.domain.rules import check_rule

TENANT = uuid.uuid4()


def net(cidr: str, name: str = "n", tenant: uuid.UUID = TENANT) -> TenantNetwork:
    return TenantNetwork(uuid.uuid4(), tenant, 10_000, ipaddress.IPv4Network(cidr), name)


@pytest.mark.parametrize("cidr", ["10.1.0.0/16", "10.1.2.0/24", "192.168.7.8/29"])
def test_a_tenant_may_choose_an_ipv4_subnet_from_slash_16_to_slash_29(cidr):
    assert cidr_problem(cidr) is None and str(parse_cidr(cidr)) == cidr


@pytest.mark.parametrize(("cidr", "why"), [
    ("10.0.0.0/15", "outside /16../29"), ("10.0.0.0/30", "outside /16../29"), ("10.0.0.1/24", "host bits set"),
    ("fd00::/64", "not an IPv4 CIDR"), ("10.0.0.0", "needs a prefix length"), ("ten", "not an IPv4 CIDR"),
])
def test_a_subnet_outside_the_rules_is_refused_with_the_reason(cidr, why):
    assert why in cidr_problem(cidr)
    with pytest.raises(Refused, match="cidr"):
        parse_cidr(cidr)


def test_networks_of_one_tenant_must_not_overlap_and_the_refusal_names_the_other_network():
    existing = [net("10.0.0.0/16", "big")]
    with pytest.raises(Refused, match=r"overlaps 10.0.0.0/16 of network 'big'"):
        check_new_network("small", ipaddress.IPv4Network("10.0.5.0/24"), existing)
    check_new_network("beside", ipaddress.IPv4Network("10.1.0.0/24"), existing)


def test_a_tenant_cannot_have_two_networks_with_one_name_or_a_malformed_name():
    with pytest.raises(Refused, match="already has a network named 'web'"):
        check_new_network("web", ipaddress.IPv4Network("10.9.0.0/24"), [net("10.0.0.0/24", "web")])
    with pytest.raises(Refused, match="name"):
        check_new_network("-bad name", ipaddress.IPv4Network("10.9.0.0/24"), [])


def test_another_tenants_network_is_reported_exactly_like_a_missing_one():
    mine, theirs = net("10.0.0.0/24"), net("10.0.0.0/24", tenant=uuid.uuid4())
    assert owned(mine.id, [mine]) is mine
    for other in (theirs.id, uuid.uuid4()):
        with pytest.raises(Refused) as exc:
            owned(other, [mine])
        assert exc.value.reason == NETWORK_NOT_FOUND


def rule(**kw) -> SecurityRule:
    return SecurityRule(id=uuid.uuid4(), **kw)


def test_an_ingress_rule_from_another_network_of_the_same_tenant_with_a_port_range_is_accepted():
    web, db = net("10.0.0.0/24", "web"), net("10.1.0.0/24", "db")
    check_rule(db.id, rule(direction="ingress", protocol="tcp", port_from=5432, port_to=5433, remote_network_id=web.id),
               [web, db], [])


def test_a_rule_naming_another_tenants_network_is_refused_as_not_found():
    db = net("10.1.0.0/24", "db")
    foreign = net("10.0.0.0/24", "web", tenant=uuid.uuid4())
    with pytest.raises(Refused, match="network not found") as exc:
        check_rule(db.id, rule(direction="ingress", remote_network_id=foreign.id), [db], [])
    assert str(foreign.tenant_id) not in exc.value.reason
    with pytest.raises(Refused, match="^network not found$"):
        check_rule(foreign.id, rule(direction="ingress", remote_network_id=db.id), [db], [])


def test_a_rule_from_the_network_itself_or_a_duplicate_is_refused():
    web, db = net("10.0.0.0/24", "web"), net("10.1.0.0/24", "db")
    with pytest.raises(Refused, match="within a network is always allowed"):
        check_rule(db.id, rule(direction="ingress", remote_network_id=db.id), [web, db], [])
    first = rule(direction="ingress", protocol="udp", port_from=53, remote_network_id=web.id)
    with pytest.raises(Refused, match="identical rule"):
        check_rule(db.id, rule(direction="ingress", protocol="udp", port_from=53, remote_network_id=web.id),
                   [web, db], [first])


def test_an_egress_rule_names_an_outside_cidr_and_nothing_else():
    web = net("10.0.0.0/24", "web")
    check_rule(web.id, rule(direction="egress", protocol="tcp", port_from=443, remote_cidr="203.0.113.0/24"), [web], [])
    with pytest.raises(Refused, match="remote_cidr"):
        check_rule(web.id, rule(direction="egress", remote_cidr="203.0.113.7/24"), [web], [])


@pytest.mark.parametrize(("fields", "bad"), [
    ({"direction": "ingress", "protocol": "icmp", "port_from": 1}, "port_from"),
    ({"direction": "ingress", "protocol": "tcp", "port_to": 80}, "port_from"),
    ({"direction": "ingress", "protocol": "tcp", "port_from": 90, "port_to": 80}, "port_to"),
    ({"direction": "ingress", "protocol": "tcp"}, "remote_network_id"),
    ({"direction": "ingress", "protocol": "tcp", "remote_cidr": "0.0.0.0/0"}, "remote_cidr"),
    ({"direction": "egress", "protocol": "any"}, "remote_cidr"),
    ({"direction": "egress", "protocol": "any", "remote_cidr": "203.0.113.0/24", "remote_network_id": uuid.uuid4()},
     "remote_network_id"),
])
def test_rule_shape_problems_name_the_offending_field(fields, bad):
    base = {"direction": "ingress", "protocol": "tcp", "port_from": None, "port_to": None, "remote_network_id": None,
                "remote_cidr": None}
    if fields["direction"] == "ingress" and "remote_network_id" not in fields and bad != "remote_network_id":
        fields = {**fields, "remote_network_id": uuid.uuid4()}
    problems = rule_problems(**{**base, **fields})
    assert bad in [f for f, _ in problems]
