"""The bare-metal lab's leaf switch, with real namespaces but no server boot: the server's port and the uplink to
the provisioning services are access ports of the provisioning VLAN, the cable bridge carries no address, the
leaf's VTEP is on the VM-slice nodes' underlay, and ``stop()`` leaves nothing behind. A stand-in for the server (a
namespace on the cable bridge) reaches the provisioning services through the leaf, and no longer once its port
leaves the provisioning VLAN. The settings and the domain XML are checked without root.
"""
from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from services.node_agent.adapters.dataplane.lab import Lab
from tooling.bmc_lab import BmcLab, server_xml
from tooling.leaf_lab import PROVISIONING_VLAN

as_root = [pytest.mark.root, pytest.mark.timeout(60),
           pytest.mark.skipif(os.geteuid() != 0, reason="namespaces, bridges and veth cables need root")]


def root(test):
    for mark in as_root:
        test = mark(test)
    return test


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=check)


def link(name: str, netns: str | None = None) -> dict | None:
    """``ip -d -j addr show`` of one link (None: no such link)."""
    proc = sh("ip", *(["-n", netns] if netns else []), "-d", "-j", "addr", "show", "dev", name, check=False)
    return json.loads(proc.stdout)[0] if proc.returncode == 0 and proc.stdout.strip() else None


def namespaces() -> set[str]:
    return {line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.strip()}


@pytest.fixture(scope="module", autouse=True)
def clean_streams():
    """No bus here (the package's fixture would purge the streams)."""
    yield


@pytest.fixture(scope="module")
def underlay():
    """The VM-slice nodes' underlay: a fabric namespace with bridge ``ul`` and two nodes on it."""
    if os.geteuid() != 0:
        pytest.skip("namespaces, bridges and veth cables need root")
    lab = Lab(2, dataplanes=False).build()
    try:
        yield lab
    finally:
        lab.destroy()


@pytest.fixture(scope="module")
def fabric(underlay):
    return underlay


@pytest.fixture(scope="module")
def bm(fabric):
    started = BmcLab(fabric=(fabric.fabric, "ul"), with_server=False).start()
    try:
        yield started
    finally:
        started.stop()


@root
def test_the_server_port_and_the_uplink_are_access_ports_of_the_provisioning_vlan(bm):
    for port in ("swp1", "prov0"):
        assert link(port, bm.leaf.netns)["master"] == f"br{PROVISIONING_VLAN}"
        assert bm.leaf.port_vlans(port) == {PROVISIONING_VLAN}
    assert link(f"tbx{bm.tag}")["master"] == f"tbc{bm.tag}"   # the server's side of its cable
    assert link(f"tbp{bm.tag}")["master"] == bm.bridge        # the provisioning services' side


@root
def test_the_cable_bridge_has_no_address_and_the_provisioning_bridge_keeps_its_own(bm):
    assert link(f"tbc{bm.tag}")["addr_info"] == []
    assert [(a["local"], a["prefixlen"]) for a in link(bm.bridge)["addr_info"] if a["family"] == "inet"] \
        == [(bm.host_address, 24)]


@root
def test_the_vtep_is_on_the_nodes_underlay(bm):
    assert [(a["local"], a["prefixlen"]) for a in link("ul0", bm.leaf.netns)["addr_info"] if a["family"] == "inet"] \
        == [("10.255.0.250", 24)]
    assert sh("ip", "netns", "exec", bm.leaf.netns, "ping", "-c1", "-W1", "10.255.0.1", check=False).returncode == 0


@root
def test_the_server_reaches_the_provisioning_services_through_the_leaf_until_its_port_moves(bm):
    server_ns, nic = f"tbs{bm.tag}", f"tbn{bm.tag}"
    try:
        sh("ip", "netns", "add", server_ns)
        sh("ip", "link", "add", nic, "type", "veth", "peer", "name", "eth0", "netns", server_ns)
        sh("ip", "link", "set", nic, "master", bm.server_bridge, "up")
        sh("ip", "-n", server_ns, "addr", "add", bm.server_address, "dev", "eth0")
        sh("ip", "-n", server_ns, "link", "set", "eth0", "up")
        ping = ("ip", "netns", "exec", server_ns, "ping", "-c1", "-W1", bm.host_address)
        assert sh(*ping, "-w5", check=False).returncode == 0   # -w: while the ports come up
        sh("ip", "-n", bm.leaf.netns, "link", "add", "br100", "type", "bridge")
        sh("ip", "-n", bm.leaf.netns, "link", "set", "swp1", "master", "br100")   # another VLAN's bridge
        sh("ip", "netns", "exec", server_ns, "ip", "neigh", "flush", "all")
        assert sh(*ping, check=False).returncode != 0
    finally:
        sh("ip", "link", "del", nic, check=False)
        sh("ip", "netns", "del", server_ns, check=False)
        sh("ip", "-n", bm.leaf.netns, "link", "set", "swp1", "master", f"br{PROVISIONING_VLAN}", check=False)
        sh("ip", "-n", bm.leaf.netns, "link", "del", "br100", check=False)


def assert_gone(lab: BmcLab, fabric_netns: str) -> None:
    assert lab.leaf.netns not in namespaces()
    for name in (f"tbm{lab.tag}", f"tbc{lab.tag}", f"tbx{lab.tag}", f"tbp{lab.tag}"):
        assert link(name) is None, name
    assert link(f"lb{lab.tag}", fabric_netns) is None
    assert lab.workdir is None or not lab.workdir.exists()


@root
def test_stop_leaves_no_namespace_link_or_bridge_behind(fabric):
    lab = BmcLab(fabric=(fabric.fabric, "ul"), with_server=False).start()
    lab.stop()
    assert_gone(lab, fabric.fabric)


@root
def test_a_start_that_fails_half_way_leaves_nothing_behind(underlay):
    lab = BmcLab(fabric=(underlay.fabric, "no-such-bridge"), with_server=False)
    with pytest.raises(RuntimeError):
        lab.start()
    assert_gone(lab, underlay.fabric)


def test_the_settings_name_the_leaf_its_port_and_the_hca():
    lab = BmcLab(fabric=("tl0-fab", "ul"), tag="a1b2c3")
    env = lab.node_env(Path("/tmp/state"))
    assert env["TESSERA_REDFISH_SWITCH_PORT"] == "leaf-bm-a1b2c3/swp1" == lab.switch_port
    assert env["TESSERA_REDFISH_HCA_GUIDS"] == lab.hca_guid
    assert lab.hca_guid.startswith("0x") and len(lab.hca_guid) == 18 and lab.hca_guid == lab.hca_guid.lower()
    int(lab.hca_guid, 16)
    assert lab.network_env() == {"TESSERA_NETWORK_FABRIC": "evpn,infiniband,leaf",
                                 "TESSERA_NETWORK_LEAF_NETNS": "leaf-bm-a1b2c3=tbla1b2c3",
                                 "TESSERA_NETWORK_PROVISIONING_VLAN": "4094"}
    assert lab.hca_guid != BmcLab(tag="d4e5f6").hca_guid


def test_without_a_fabric_the_server_is_on_the_provisioning_bridge_and_nothing_names_a_leaf():
    lab = BmcLab(tag="a1b2c3")
    assert lab.leaf is None and lab.switch_port is None and lab.network_env() == {}
    assert lab.server_bridge == lab.bridge
    assert not {"TESSERA_REDFISH_SWITCH_PORT", "TESSERA_REDFISH_HCA_GUIDS"} & set(lab.node_env(Path("/tmp/state")))


def test_the_servers_second_serial_port_is_a_unix_socket():
    domain = ET.fromstring(server_xml("s", "00000000-0000-0000-0000-000000000001", "52:54:00:00:00:01", "br0",
                                      Path("/tmp/console.log"), ["/dev/loop9"], Path("/tmp/shell.sock")))
    shell = domain.find("./devices/serial[@type='unix']")
    assert shell.find("source").attrib == {"mode": "bind", "path": "/tmp/shell.sock"}
    assert shell.find("target").get("port") == "1"
