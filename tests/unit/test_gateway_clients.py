"""The client's address behind trusted proxies (services/gateway/http/clients.py): X-Forwarded-For is believed only
from a trusted peer, and only up to the first hop that is not a trusted proxy."""
from __future__ import annotations

import ipaddress

from services.gateway.http.clients import client_address
from services.gateway.settings import networks

PROXIES = networks("10.0.0.0/8, 192.168.1.5, fd00::/8")


def test_without_trusted_proxies_the_peer_is_the_client_whatever_the_header_says():
    assert client_address("203.0.113.9", ["198.51.100.1"], ()) == "203.0.113.9"


def test_from_an_untrusted_peer_the_header_is_ignored():
    assert client_address("203.0.113.9", ["198.51.100.1"], PROXIES) == "203.0.113.9"


def test_from_a_trusted_proxy_the_right_most_untrusted_hop_is_the_client():
    assert client_address("10.1.2.3", ["198.51.100.1"], PROXIES) == "198.51.100.1"
    # the client wrote the left part itself: only what our proxies appended counts
    assert client_address("10.1.2.3", ["6.6.6.6, 198.51.100.1, 192.168.1.5"], PROXIES) == "198.51.100.1"
    assert client_address("10.1.2.3", ["6.6.6.6", "198.51.100.1, 10.9.9.9"], PROXIES) == "198.51.100.1"   # two lines
    assert client_address("fd00::1", ["2001:db8::7"], PROXIES) == "2001:db8::7"


def test_a_chain_of_only_proxies_gives_the_left_most_and_garbage_gives_the_peer():
    assert client_address("10.1.2.3", ["10.4.4.4, 10.5.5.5"], PROXIES) == "10.4.4.4"
    assert client_address("10.1.2.3", ["not-an-address, 198.51.100.1"], PROXIES) == "198.51.100.1"
    assert client_address("10.1.2.3", ["198.51.100.1, <script>"], PROXIES) == "10.1.2.3"
    assert client_address("10.1.2.3", [], PROXIES) == "10.1.2.3"


def test_the_setting_reads_addresses_and_networks():
    assert networks("127.0.0.1, 10.0.0.0/8") == (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("10.0.0.0/8"))
    assert networks("") == ()
