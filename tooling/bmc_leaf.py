"""The bare-metal lab's leaf switch: the server is cabled to a leaf (``tooling.leaf_lab``) rather than plugged into
the provisioning bridge, so the network service's kernel fabric driver can move its port between the provisioning
VLAN and a tenant network's VLAN (mapped on the leaf to that network's VXLAN VNI, on the VM-slice nodes' underlay).

Topology (``tag`` names everything, so labs never collide):
- the server's NIC sits on a *cable* bridge ``tbc<tag>`` in this host's namespace: it has no address (a cable, not a
  network); its other port is the host end of the cable to the leaf's ``swp1``;
- the provisioning bridge ``tbm<tag>`` (the provisioning services listen on its host address) is cabled to the leaf's
  uplink ``prov0``;
- both leaf ports start as access ports of the provisioning VLAN, so during deploy the server reaches the
  provisioning services through the leaf, and once its port is moved to a tenant VLAN it cannot;
- the leaf's ``ul0`` holds the VTEP address on the fabric's underlay bridge.

Blocking helpers; needs root. ``destroy`` removes everything ``build`` made (never raises; safe after a partial build).
"""
from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass, field

from .leaf_lab import LeafLab

SERVER_PORT = "swp1"     # the leaf port the server's NIC is cabled to
UPLINK_PORT = "prov0"    # the leaf port cabled to the provisioning services
DEFAULT_VTEP = "10.255.0.250/24"   # on the lab underlay (10.255.0.0/24), above the nodes' addresses
MELLANOX_OUI = "0002c9"


def _ip(*argv: str, check: bool = True) -> None:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


def hca_guid(tag: str) -> str:
    """A fake but well-formed InfiniBand port GUID for the server of lab ``tag``: ``0x`` + 16 lower-case hex digits,
    a Mellanox OUI then bits of the tag's digest (stable for a tag, distinct across tags)."""
    return "0x" + MELLANOX_OUI + "03" + hashlib.sha256(tag.encode()).hexdigest()[:8]


@dataclass
class ServerLeaf:
    """The leaf of the bare-metal lab ``tag``, on ``fabric`` = (fabric namespace, underlay bridge) with VTEP
    address ``vtep`` (address/prefix)."""

    tag: str
    fabric: tuple[str, str]
    vtep: str = DEFAULT_VTEP
    leaf: LeafLab = field(init=False)
    _cable_bridge_made: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.leaf = LeafLab(name=f"leaf-bm-{self.tag}", netns=f"tbl{self.tag}")

    @property
    def cable_bridge(self) -> str:
        """The host-side bridge the server's NIC is on: its cable to the leaf."""
        return f"tbc{self.tag}"

    @property
    def switch_port(self) -> str:
        """``<leaf>/<port>`` of the server's NIC (the redfish driver's TESSERA_REDFISH_SWITCH_PORT)."""
        return f"{self.leaf.name}/{SERVER_PORT}"

    def build(self, provisioning_bridge: str) -> ServerLeaf:
        """Make the cable bridge and the leaf, cable the server side to ``swp1`` and ``provisioning_bridge`` (which
        must exist) to ``prov0``. On failure what was made is removed before the error propagates."""
        try:
            _ip("link", "add", self.cable_bridge, "type", "bridge")
            self._cable_bridge_made = True
            # no IPv6 link-local either: the host takes no part in the traffic on this cable
            _ip("link", "set", self.cable_bridge, "addrgenmode", "none")
            _ip("link", "set", self.cable_bridge, "up")
            fabric_netns, fabric_bridge = self.fabric
            self.leaf.build(fabric_netns, fabric_bridge, self.vtep, f"lb{self.tag}")
            self.leaf.cable(SERVER_PORT, f"tbx{self.tag}", peer_master=self.cable_bridge)
            self.leaf.cable(UPLINK_PORT, f"tbp{self.tag}", peer_master=provisioning_bridge)
        except Exception:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        """Remove the leaf (its namespace and cables) and the cable bridge; never raises."""
        self.leaf.destroy()
        if self._cable_bridge_made:
            _ip("link", "del", self.cable_bridge, check=False)
            self._cable_bridge_made = False

    def network_env(self) -> dict[str, str]:
        """The network service's settings for its kernel leaf driver, with this leaf the one it programs."""
        return {"TESSERA_NETWORK_FABRIC": "evpn,infiniband,leaf",
                "TESSERA_NETWORK_LEAF_NETNS": f"{self.leaf.name}={self.leaf.netns}",
                "TESSERA_NETWORK_PROVISIONING_VLAN": str(self.leaf.provisioning_vlan)}
