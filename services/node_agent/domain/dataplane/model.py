"""The kernel objects a node should hold for its tenant networks: pure, no I/O.

From the latest ``TenantNetworks`` snapshot of each tenant and the
``SlotAttachment``s on this node, ``desired_state`` computes every object the
node owns, each with a fingerprint the kernel adapter can read back:

- per tenant with a slot here: a router namespace ``tr-<node>-<tenant>`` (the
  kernel has no VRF device: the namespace is the tenant's routing context),
  ip_forward on, and an nft ``inet tessera`` table whose forward chain drops
  everything between the tenant's networks except what its rules open;
- per network of such a tenant (ALL of its networks, not only those with a slot
  here: the router is distributed, so the router on any node must be able to
  route to each of the tenant's networks, and a slot may use any node's router):
  a bridge ``tbr<vni>``, a VXLAN device ``tvx<vni>`` over the underlay (multicast
  group 239.<vni bytes>, learning on: self-contained, no peer list needed; head-end
  replication would need every node's underlay address, which no snapshot carries),
  and a router leg: veth ``tlg<vni>`` on the bridge, its peer ``gw<vni>`` in the
  router namespace holding the gateway IP;
- per attachment: namespace ``ts-<node>-<attachment>`` (the VM's stand-in) and a
  veth ``tv<attachment 8 hex>`` on the bridge whose peer ``eth0`` in that
  namespace holds the slot's MAC, IP/prefix and default route via the gateway;
  or, with ``guest_ports`` (the libvirt driver), the VM's own tap ``tv<attachment 8 hex>``
  on the bridge: the hypervisor makes it when the VM starts, the node only plugs it;
- per node: an nft ``bridge tessera`` table dropping frames a slot port sends
  with a source MAC or IP (ARP included) that is not its own.

The gateway IP is the same on every node (distributed anycast gateway), but the
gateway MAC is unique per node: with one shared MAC a router's ARP request for a
slot on another node would be answered to that MAC, which the remote bridge
delivers to its own local router, and no router could resolve remote slots
without an EVPN-style control plane. Any node's router routes correctly, since
every router of a tenant holds all its legs and the same stateless rules.
"""
from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from services.network.contracts import NetworkSnapshot, SlotAttachment, TenantNetworks

from . import render
from .names import (
    bridge_name,
    fingerprint,
    gateway_mac,
    leg_name,
    router_netns,
    slot_netns,
    slot_port_name,
    vxlan_group,
    vxlan_name,
)

# Creation order. The rules come before the ports they guard (nft matches interfaces by name, so a
# table may name a port that does not exist yet): a new slot or leg is never up without its filter.
KIND_ORDER = ("router", "nft_router", "nft_node", "bridge", "vxlan", "leg", "slot")


class InvalidAttachment(ValueError):
    """The attachment cannot be plumbed as given (unknown network, address outside the subnet ...)."""


@dataclass(frozen=True)
class Segment:
    """One tenant network plumbed on this node."""

    tenant_id: uuid.UUID
    network_id: uuid.UUID
    vni: int
    cidr: str
    gateway_ip: str
    gateway_mac: str
    router_ns: str

    @property
    def prefix_len(self) -> int:
        return ipaddress.ip_network(self.cidr).prefixlen


@dataclass(frozen=True)
class SlotPort:
    """One attachment's veth; the far end is the slot's NIC."""

    allocation_id: uuid.UUID
    attachment_id: uuid.UUID
    tenant_id: uuid.UUID
    vni: int
    port: str
    netns: str
    ip_address: str
    prefix_len: int
    mac_address: str
    gateway_ip: str


@dataclass(frozen=True)
class Obj:
    """One owned kernel object: ``fp`` is what the kernel adapter must read back for it to count as intact."""

    kind: str
    name: str
    fp: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.name)


@dataclass
class DesiredNode:
    segments: dict[int, Segment] = field(default_factory=dict)
    routers: dict[uuid.UUID, str] = field(default_factory=dict)          # tenant -> router namespace
    slots: dict[uuid.UUID, SlotPort] = field(default_factory=dict)       # allocation -> port
    node_nft: str | None = None
    router_nft: dict[str, str] = field(default_factory=dict)            # router namespace -> nft text
    guest_ports: bool = False   # True: a slot's port is its VM's tap (the hypervisor makes it), not a veth

    def objects(self) -> dict[tuple[str, str], Obj]:
        """Every owned object with its fingerprint (the reconcile's unit of comparison)."""
        objs = [Obj("router", ns, "") for ns in self.routers.values()]
        for seg in self.segments.values():
            bridge = bridge_name(seg.vni)
            objs += [Obj("bridge", bridge, ""),
                     Obj("vxlan", vxlan_name(seg.vni), f"vni={seg.vni} group={vxlan_group(seg.vni)} master={bridge}"),
                     Obj("leg", leg_name(seg.vni), f"master={bridge}")]
        if self.guest_ports:
            objs += [Obj("slot", s.port, tap_fp(bridge_name(s.vni))) for s in self.slots.values()]
        else:
            objs += [Obj("slot", s.netns, slot_fp(bridge_name(s.vni), s.mac_address, f"{s.ip_address}/{s.prefix_len}"))
                     for s in self.slots.values()]
        if self.node_nft is not None:
            objs.append(Obj("nft_node", "node", fingerprint(self.node_nft)))
        objs += [Obj("nft_router", ns, fingerprint(text)) for ns, text in self.router_nft.items()]
        return {o.key: o for o in objs}


def tap_fp(master: str | None) -> str:
    """A VM's tap: only its bridge is the node's (its MAC and IP are the guest's own, set inside the guest)."""
    return f"tap master={master}"


def slot_fp(master: str | None, mac: str | None, cidr: str | None) -> str:
    return f"master={master} mac={(mac or '').lower()} ip={cidr}"


def _check_attachment(att: SlotAttachment, net: NetworkSnapshot) -> None:
    subnet = ipaddress.ip_network(net.cidr)
    try:
        ip = ipaddress.ip_address(att.ip_address)
    except ValueError:
        raise InvalidAttachment(f"attachment {att.attachment_id}: {att.ip_address!r} is not an IP address") from None
    if ip not in subnet or att.prefix_len != subnet.prefixlen:
        raise InvalidAttachment(f"attachment {att.attachment_id}: {att.ip_address}/{att.prefix_len} is not in {net.cidr}")
    if str(ip) == net.gateway_ip:
        raise InvalidAttachment(f"attachment {att.attachment_id}: {att.ip_address} is the gateway address")


def network_of(tenant: TenantNetworks, network_id: uuid.UUID) -> NetworkSnapshot:
    for net in tenant.networks:
        if net.network_id == network_id:
            return net
    raise InvalidAttachment(f"network {network_id} is not one of tenant {tenant.tenant_id}'s networks "
                            f"(snapshot version {tenant.version})")


def desired_state(tag: str, tenants: Mapping[uuid.UUID, TenantNetworks],
                  attachments: Iterable[tuple[uuid.UUID, SlotAttachment]], guest_ports: bool = False) -> DesiredNode:
    """The node's desired objects; ``attachments`` are (tenant_id, attachment) pairs. ``guest_ports``: each slot's
    port is the tap of its VM (named like the veth it replaces, so the same rules guard it).

    Raises InvalidAttachment when an attachment does not fit its tenant's snapshot.
    """
    state = DesiredNode(guest_ports=guest_ports)
    for tenant_id, att in attachments:
        if tenant_id not in tenants:
            raise InvalidAttachment(f"attachment {att.attachment_id}: no network snapshot of tenant {tenant_id}")
        net = network_of(tenants[tenant_id], att.network_id)
        _check_attachment(att, net)
        state.slots[att.allocation_id] = SlotPort(
            att.allocation_id, att.attachment_id, tenant_id, net.vni, slot_port_name(att.attachment_id),
            slot_netns(tag, att.attachment_id), att.ip_address, att.prefix_len, att.mac_address.lower(), net.gateway_ip)
        state.routers[tenant_id] = router_netns(tag, tenant_id)
    for tenant_id, ns in state.routers.items():
        for net in tenants[tenant_id].networks:
            state.segments[net.vni] = Segment(tenant_id, net.network_id, net.vni, net.cidr, net.gateway_ip,
                                              gateway_mac(tag, net.vni), ns)
        state.router_nft[ns] = render.router_table(tenants[tenant_id])
    if state.slots:
        state.node_nft = render.node_table(state.slots.values())
    return state
