"""What a Linux leaf switch must run to match what the network service holds for it: pure planning, no I/O.

A Linux leaf (SONiC, Cumulus Linux, or the lab's namespace) bridges its server ports and its VXLAN devices in one
VLAN-aware bridge. For each tenant network served on the leaf it carries the network's VNI on a VXLAN device that is
an access port of the network's leaf-local VLAN; each bare-metal server port bound to a tenant network is an access
port of that network's VLAN, and every other server port Tessera has touched is back in the provisioning VLAN.
``plan`` turns the difference between what the leaf has (``LeafState``, read by the driver) and what it should have
(``LeafWant``) into the commands that close it, in an order that never puts a port in two VLANs at once: a port
leaves its old VLAN before it joins the new one.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from shared.vxlan import VXLAN_OVERHEAD, VXLAN_PORT, vxlan_group

BRIDGE = "br_default"
UNDERLAY = "ul0"
ALIAS = "tessera:vxlan:"


def vxlan_device(vni: int) -> str:
    return f"vx{vni:06x}"


@dataclass(frozen=True)
class LeafState:
    """What the leaf has: its links, the VLANs of each bridge port, the VXLAN devices Tessera made (by VNI)."""
    links: frozenset[str]
    vlans: dict[str, frozenset[int]]           # bridge port → its VLANs
    vxlans: dict[int, str]                     # VNI → device name (only those with Tessera's alias)
    underlay_mtu: int = 1500


@dataclass(frozen=True)
class LeafWant:
    """What the leaf should carry: each served network's VNI → (its VLAN, its id), each bound port → its VLAN, and
    the ports to return to the provisioning VLAN (unbound now)."""
    segments: dict[int, tuple[int, uuid.UUID]]
    ports: dict[str, int]
    restore: frozenset[str] = field(default_factory=frozenset)


class LeafRefusal(Exception):
    """The leaf cannot be brought to what is wanted (a missing bridge, underlay or port); str(exc) says what."""


def check(state: LeafState, want: LeafWant) -> None:
    """Refuse what no command can fix: the day-0 bridge and underlay are missing, or a port is not on the leaf."""
    for link in (BRIDGE, UNDERLAY):
        if link not in state.links:
            raise LeafRefusal(f"has no {link}: it is not configured as a leaf (a VLAN-aware bridge {BRIDGE} and an "
                              f"underlay port {UNDERLAY})")
    for port in sorted({*want.ports, *want.restore}):
        if port not in state.links:
            raise LeafRefusal(f"has no port {port}")


def plan(state: LeafState, want: LeafWant, provisioning_vlan: int) -> list[list[str]]:
    """The commands (argv of ``ip``/``bridge``, without the namespace) that bring ``state`` to ``want``."""
    cmds: list[list[str]] = []
    for vni, dev in sorted(state.vxlans.items()):
        if vni not in want.segments:
            cmds.append(["ip", "link", "del", dev])
    mtu = str(state.underlay_mtu - VXLAN_OVERHEAD)
    for vni, (vlan, network_id) in sorted(want.segments.items()):
        dev = state.vxlans.get(vni) or vxlan_device(vni)
        if vni not in state.vxlans:
            cmds += [["ip", "link", "add", dev, "type", "vxlan", "id", str(vni), "group", vxlan_group(vni),
                      "dev", UNDERLAY, "dstport", str(VXLAN_PORT), "learning"],
                     ["ip", "link", "set", dev, "alias", f"{ALIAS}{network_id}"],
                     ["ip", "link", "set", dev, "mtu", mtu, "master", BRIDGE, "up"]]
        cmds += _access(dev, state.vlans.get(dev, frozenset()), vlan)
    for port, vlan in sorted(want.ports.items()):
        cmds += _access(port, state.vlans.get(port, frozenset()), vlan)
    for port in sorted(want.restore - set(want.ports)):
        cmds += _access(port, state.vlans.get(port, frozenset()), provisioning_vlan)
    return cmds


def _access(dev: str, has: frozenset[int], vlan: int) -> list[list[str]]:
    """``dev`` an access port of ``vlan`` only: its other VLANs go first."""
    cmds = [["bridge", "vlan", "del", "dev", dev, "vid", str(v)] for v in sorted(has - {vlan})]
    if vlan not in has or len(has) > 1:
        cmds.append(["bridge", "vlan", "add", "dev", dev, "vid", str(vlan), "pvid", "untagged"])
    return cmds
