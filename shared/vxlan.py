"""The VXLAN conventions every VTEP of the fabric shares: the node-agents' dataplane on VM-slice nodes and the leaf
switches in front of bare-metal servers. Both ends of a segment must agree on them, so they live here, once.

Flood-and-learn over the underlay: one multicast group per VNI, the IANA port, learning on. Pure (no I/O).
"""
from __future__ import annotations

VXLAN_PORT = 4789     # IANA's VXLAN port (RFC 7348)
VXLAN_OVERHEAD = 50   # outer Ethernet, IPv4, UDP and VXLAN headers: a tenant MTU is the underlay's less this


def vxlan_group(vni: int) -> str:
    """A multicast group per VNI, inside the organisation-local scope 239.0.0.0/8."""
    return f"239.{(vni >> 16) & 255}.{(vni >> 8) & 255}.{vni & 255}"
