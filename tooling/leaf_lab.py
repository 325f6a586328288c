"""A leaf switch in a network namespace, for the tests and ``./taskw up``: what SONiC and Cumulus Linux leaves are
(Linux with bridges and VXLAN devices), in the state a provider leaves a leaf before Tessera programs it.

The leaf runs in traditional bridge mode (Cumulus Linux supports it beside VLAN-aware mode): one bridge per VLAN,
named ``br<vlan>``, holding that VLAN's access ports and, for a tenant network, its VXLAN device. It needs no VLAN
filtering in the kernel (this machine's kernel has none), and moving an access port between VLANs is one change of
its bridge.

Day-0 configuration (what this module makes):
- the namespace ``netns`` with the provisioning VLAN's bridge ``br<provisioning vlan>`` (no multicast snooping);
- an underlay port ``ul0`` with the leaf's VTEP address, cabled to the fabric's underlay bridge (where the nodes'
  underlay ports are);
- ports cabled to servers and uplinks (``cable``): each a veth whose leaf end is a bridge port; a server-facing port
  starts as an access port of the provisioning VLAN, as does the uplink to the provisioning services.

What Tessera's kernel fabric driver (``services/network/adapters/fabric/leaf.py``) adds and removes on it: the
VXLAN device of each tenant network served there (mapped to a leaf-local VLAN) and the VLAN of each server port.
Blocking helpers; needs root. ``destroy`` removes the namespace and the cables' outer ends (never raises).
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field

from services.network.domain.leaf import UNDERLAY, vlan_bridge  # the names the leaf driver programs

PROVISIONING_VLAN = 4094


def _ip(*argv: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", netns] if netns else []), *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def vlan_of_bridge(name: str | None) -> int | None:
    """The VLAN whose bridge ``name`` is, or None."""
    return int(name[2:]) if name and name.startswith("br") and name[2:].isdigit() else None


@dataclass
class LeafLab:
    """One leaf: ``name`` is the switch's name in the network plan, ``netns`` its namespace."""

    name: str
    netns: str
    provisioning_vlan: int = PROVISIONING_VLAN
    outer: list[tuple[str | None, str]] = field(default_factory=list)   # (namespace, link) of each cable's far end

    def build(self, fabric_netns: str, fabric_bridge: str, vtep: str, fabric_port: str) -> LeafLab:
        """Make the namespace, its bridge and its underlay port ``ul0`` with the VTEP address ``vtep``
        (address/prefix), cabled to ``fabric_bridge`` in ``fabric_netns`` as ``fabric_port``."""
        try:
            _ip("netns", "add", self.netns)
            _ip("link", "set", "lo", "up", netns=self.netns)
            bridge = vlan_bridge(self.provisioning_vlan)
            _ip("link", "add", bridge, "type", "bridge", "mcast_snooping", "0", "stp_state", "0", "forward_delay", "0",
                netns=self.netns)
            _ip("link", "set", bridge, "up", netns=self.netns)
            _ip("link", "add", UNDERLAY, "netns", self.netns, "type", "veth", "peer", "name", fabric_port,
                "netns", fabric_netns)
            self.outer.append((fabric_netns, fabric_port))
            _ip("link", "set", fabric_port, "master", fabric_bridge, "up", netns=fabric_netns)
            _ip("addr", "add", vtep, "dev", UNDERLAY, netns=self.netns)
            _ip("link", "set", UNDERLAY, "up", netns=self.netns)
        except Exception:
            self.destroy()
            raise
        return self

    def cable(self, port: str, peer: str, *, peer_netns: str | None = None, peer_master: str | None = None,
              vlan: int | None = None) -> None:
        """A cable: veth ``port`` on the leaf (a bridge port, access port of ``vlan``, default the provisioning
        VLAN) to ``peer`` in ``peer_netns`` (None: this host's namespace), enslaved to ``peer_master`` when given."""
        _ip("link", "add", port, "netns", self.netns, "type", "veth", "peer", "name", peer,
            *(["netns", peer_netns] if peer_netns else []))
        self.outer.append((peer_netns, peer))
        _ip("link", "set", port, "master", vlan_bridge(vlan or self.provisioning_vlan), "up", netns=self.netns)
        if peer_master:
            _ip("link", "set", peer, "master", peer_master, netns=peer_netns)
        _ip("link", "set", peer, "up", netns=peer_netns)

    def port_vlans(self, port: str) -> set[int]:
        """The VLANs bridge port ``port`` carries now: its bridge's (none when it is in no VLAN's bridge)."""
        [link] = json.loads(_ip("-j", "link", "show", "dev", port, netns=self.netns).stdout)
        vlan = vlan_of_bridge(link.get("master"))
        return set() if vlan is None else {vlan}

    def rename(self, port: str, name: str) -> None:
        """Rename a port of the leaf (a test's way of making it refuse a port it no longer has)."""
        _ip("link", "set", port, "down", netns=self.netns)
        _ip("link", "set", port, "name", name, netns=self.netns)
        _ip("link", "set", name, "up", netns=self.netns)

    def tessera_links(self) -> list[str]:
        """What the leaf driver made on the leaf (VXLAN devices, VLAN bridges: its ``tessera:`` alias), by name."""
        links = json.loads(_ip("-j", "-d", "link", "show", netns=self.netns).stdout or "[]")
        return sorted(link["ifname"] for link in links if str(link.get("ifalias", "")).startswith("tessera:"))

    def destroy(self) -> None:
        """Remove the namespace (its links go with it) and the cables' far ends; never raises."""
        _ip("netns", "del", self.netns, check=False)
        for netns, link in reversed(self.outer):
            _ip("link", "del", link, netns=netns, check=False)
        self.outer.clear()
