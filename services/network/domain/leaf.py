"""What a Linux leaf switch must run to match what the network service holds for it: pure planning, no I/O.

A Linux leaf (SONiC, Cumulus Linux, or the lab's namespace) is driven in traditional bridge mode: one bridge per
leaf-local VLAN, ``br<vlan>``, holding that VLAN's access ports. For each tenant network served on the leaf, its VLAN's
bridge also holds the network's VXLAN device (its VNI, flood-and-learn over the underlay, as the nodes' dataplane
does); a bare-metal server port bound to the network is an access port of that bridge, and every other server port
Tessera has touched is back in the provisioning VLAN's bridge (the leaf's day-0 configuration). Traditional mode needs
no VLAN filtering in the kernel, and a port changes VLAN in one step (its bridge), so it is never in two at once.

``plan`` turns the difference between what the leaf has (``LeafState``, read by the driver) and what it should have
(``LeafWant``) into the commands that close it: the wanted bridges and VXLAN devices first, then the ports, then what
is no longer wanted.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from shared.vxlan import VXLAN_OVERHEAD, VXLAN_PORT, vxlan_group

UNDERLAY = "ul0"
VXLAN_ALIAS = "tessera:vxlan:"
BRIDGE_ALIAS = "tessera:vlan:"


def vxlan_device(vni: int) -> str:
    return f"vx{vni:06x}"


def vlan_bridge(vlan: int) -> str:
    return f"br{vlan}"


@dataclass(frozen=True)
class LeafState:
    """What the leaf has: its links and each one's bridge (None: none), the VXLAN devices and VLAN bridges Tessera
    made (recognised by their alias: a link of the provider's own is never touched)."""
    masters: dict[str, str | None]
    vxlans: dict[int, str]                     # VNI → device
    bridges: frozenset[str] = frozenset()      # VLAN bridges of tenant networks
    underlay_mtu: int = 1500

    @property
    def links(self) -> frozenset[str]:
        return frozenset(self.masters)


@dataclass(frozen=True)
class LeafWant:
    """What the leaf should carry: each served network's VNI → (its VLAN, its id), each bound port → its VLAN, and
    the ports to return to the provisioning VLAN (unbound now)."""
    segments: dict[int, tuple[int, uuid.UUID]]
    ports: dict[str, int]
    restore: frozenset[str] = field(default_factory=frozenset)


class LeafRefusal(Exception):
    """The leaf cannot be brought to what is wanted (a missing underlay, provisioning bridge or port)."""


def check(state: LeafState, want: LeafWant, provisioning_vlan: int) -> None:
    """Refuse what no command can fix: the day-0 underlay and provisioning bridge are missing, or a port is not on
    the leaf."""
    for link in (UNDERLAY, vlan_bridge(provisioning_vlan)):
        if link not in state.masters:
            raise LeafRefusal(f"has no {link}: it is not configured as a leaf (an underlay port {UNDERLAY} and the "
                              f"provisioning VLAN's bridge {vlan_bridge(provisioning_vlan)})")
    for port in sorted({*want.ports, *want.restore}):
        if port not in state.masters:
            raise LeafRefusal(f"has no port {port}")


def plan(state: LeafState, want: LeafWant, provisioning_vlan: int) -> list[list[str]]:
    """The commands (argv of ``ip``, without the namespace) that bring ``state`` to ``want``."""
    cmds: list[list[str]] = []
    mtu = str(state.underlay_mtu - VXLAN_OVERHEAD)
    wanted_bridges = {vlan_bridge(vlan) for vlan, _ in want.segments.values()}
    for vni, (vlan, network_id) in sorted(want.segments.items()):
        bridge = vlan_bridge(vlan)
        if bridge not in state.masters:
            cmds += [["ip", "link", "add", bridge, "type", "bridge", "mcast_snooping", "0", "stp_state", "0",
                      "forward_delay", "0"],
                     ["ip", "link", "set", bridge, "alias", f"{BRIDGE_ALIAS}{network_id}"],
                     ["ip", "link", "set", bridge, "up"]]
        dev = state.vxlans.get(vni)
        if dev is None:
            dev = vxlan_device(vni)
            cmds += [["ip", "link", "add", dev, "type", "vxlan", "id", str(vni), "group", vxlan_group(vni),
                      "dev", UNDERLAY, "dstport", str(VXLAN_PORT), "learning"],
                     ["ip", "link", "set", dev, "alias", f"{VXLAN_ALIAS}{network_id}"],
                     ["ip", "link", "set", dev, "mtu", mtu, "master", bridge, "up"]]
        elif state.masters.get(dev) != bridge:
            cmds.append(["ip", "link", "set", dev, "master", bridge])
    targets = {port: vlan_bridge(vlan) for port, vlan in want.ports.items()}
    targets.update({port: vlan_bridge(provisioning_vlan) for port in want.restore if port not in want.ports})
    for port, bridge in sorted(targets.items()):
        if state.masters.get(port) != bridge:
            cmds.append(["ip", "link", "set", port, "master", bridge])
    for vni, dev in sorted(state.vxlans.items()):
        if vni not in want.segments:
            cmds.append(["ip", "link", "del", dev])
    for bridge in sorted(state.bridges - wanted_bridges - {vlan_bridge(provisioning_vlan)}):
        cmds.append(["ip", "link", "del", bridge])
    return cmds
