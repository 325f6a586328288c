"""VNI allocation, IP address management and MAC derivation (pure domain, no I/O)."""
from __future__ import annotations

import ipaddress
import uuid

import pytest

from services.network.domain.model import NetworkPlan, VniPool, free_address, gateway_ip, mac_for, slot_range

NET = ipaddress.IPv4Network("10.0.0.0/24")


def ip(s: str) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(s)


def test_vni_pool_defaults_to_10000_through_the_24_bit_maximum():
    assert (VniPool().first, VniPool().last) == (10_000, 16_777_215)


def test_lowest_free_vni_is_the_pool_start_when_nothing_is_used():
    assert VniPool(100, 200).lowest_free([]) == 100


def test_lowest_free_vni_fills_the_first_gap_whatever_the_order_of_used():
    assert VniPool(100, 200).lowest_free([103, 100, 101]) == 102


def test_lowest_free_vni_ignores_values_outside_the_pool_and_duplicates():
    assert VniPool(100, 200).lowest_free([5, 99, 100, 100, 500]) == 101


def test_exhausted_vni_pool_has_no_free_vni():
    assert VniPool(100, 102).lowest_free([100, 101, 102]) is None


@pytest.mark.parametrize("first,last", [(0, 10), (10, 9), (1, 1 << 24)])
def test_vni_pool_outside_the_24_bit_range_or_reversed_is_refused(first, last):
    with pytest.raises(ValueError):
        VniPool(first, last)


def lowest(net: ipaddress.IPv4Network, used: list[ipaddress.IPv4Address]) -> ipaddress.IPv4Address | None:
    """The address a slot without a wish gets."""
    return free_address(*slot_range(net), None, used)


def test_the_gateway_is_the_first_host_and_slots_start_at_the_next_one():
    assert gateway_ip(NET) == ip("10.0.0.1")
    assert lowest(NET, []) == ip("10.0.0.2")
    assert lowest(NET, [ip("10.0.0.2"), ip("10.0.0.4")]) == ip("10.0.0.3")


def test_a_released_address_is_reused_first():
    used = [ip(f"10.0.0.{i}") for i in range(2, 12) if i != 4]
    assert lowest(NET, used) == ip("10.0.0.4")


def test_full_subnet_has_no_free_address_and_never_offers_the_gateway_or_broadcast_address():
    used = [ip(f"10.0.0.{i}") for i in range(2, 255)]
    assert lowest(NET, used) is None
    assert lowest(ipaddress.IPv4Network("10.1.0.0/30"), [ip("10.1.0.2")]) is None


def test_mac_is_deterministic_per_attachment_and_differs_between_attachments():
    a, b = uuid.uuid4(), uuid.uuid4()
    assert mac_for(a) == mac_for(a)
    assert mac_for(a) != mac_for(b)


def test_mac_is_locally_administered_unicast_in_colon_notation():
    for _ in range(200):
        mac = mac_for(uuid.uuid4())
        octets = mac.split(":")
        assert len(octets) == 6 and all(len(o) == 2 for o in octets)
        first = int(octets[0], 16)
        assert first & 0b10 == 0b10, "locally administered bit set"
        assert first & 0b01 == 0, "multicast bit clear"


@pytest.mark.parametrize("cidr", ["10.0.0.0/31", "10.0.0.0/32"])
def test_network_plan_refuses_a_default_subnet_without_room_for_a_gateway_and_a_slot(cidr):
    with pytest.raises(ValueError, match="too small"):
        NetworkPlan(tenant_cidr=ipaddress.IPv4Network(cidr))


def nets(*cidrs: str) -> list[ipaddress.IPv4Network]:
    return [ipaddress.IPv4Network(c) for c in cidrs]


def test_the_default_subnet_is_the_first_choice_while_no_network_of_the_tenant_overlaps_it():
    assert NetworkPlan().default_subnet([]) == NET
    assert NetworkPlan().default_subnet(nets("172.16.0.0/24", "10.0.1.0/24")) == NET


@pytest.mark.parametrize("taken,expected", [
    (["10.0.0.0/24"], "10.0.1.0/24"),                       # the tenant made the first choice itself
    (["10.0.0.0/16"], "10.1.0.0/24"),                       # a larger network covering it
    (["10.0.0.128/25", "10.0.1.0/24", "10.0.3.0/24"], "10.0.2.0/24"),   # the first gap, whatever the order
    (["10.0.0.0/9", "10.200.0.0/24"], "10.128.0.0/24"),
])
def test_the_default_subnet_is_the_lowest_of_its_size_in_the_pool_overlapping_none_of_the_tenants(taken, expected):
    got = NetworkPlan().default_subnet(nets(*taken))
    assert got == ipaddress.IPv4Network(expected)
    assert not any(got.overlaps(t) for t in nets(*taken))


def test_the_default_subnet_takes_its_size_from_the_first_choice_and_its_range_from_the_pool():
    plan = NetworkPlan(tenant_cidr=ipaddress.IPv4Network("192.168.0.0/26"),
                       default_pool=ipaddress.IPv4Network("192.168.0.0/24"))
    assert plan.default_subnet(nets("192.168.0.0/25")) == ipaddress.IPv4Network("192.168.0.128/26")
    assert plan.default_subnet(nets("192.168.0.0/24")) is None                    # the pool is covered


def test_a_default_pool_smaller_than_one_default_network_is_refused():
    with pytest.raises(ValueError, match="smaller than one default network"):
        NetworkPlan(default_pool=ipaddress.IPv4Network("10.0.0.0/25"))
