"""nftables text for a node's anti-spoofing table and a tenant router's forward chain: pure.

Rules between a tenant's networks are STATELESS on purpose. The router is
distributed: a request N1 -> N2 is routed by the router of the node it leaves,
its reply by the router of the node the reply leaves, so neither router's
conntrack sees both directions (a SYN/ACK first seen by conntrack is invalid).
Each opened flow therefore gets a forward rule (remote -> network, destination
port) and a reply rule (network -> remote, SOURCE port), the reply rule for TCP
refusing a bare SYN so the opened side cannot start connections from that port.
Limits: a UDP rule lets the opened side send from the rule's ports to any port
of the remote; an ``any`` rule opens UDP in both directions.
Egress rules to an outside CIDR (north-south, through NAT) are not rendered here.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable

from services.network.contracts import SecurityRule, TenantNetworks

from .names import gw_ifname

TABLE = "tessera"
ICMP_REPLIES = "icmp type { echo-reply, destination-unreachable, time-exceeded }"


def table_script(family: str, body: str | None, fp: str = "") -> str:
    """An nft -f script replacing table ``family tessera`` atomically (``body`` None: only delete it).

    Declaring the table first makes the delete valid when it does not exist yet,
    so applying the script is idempotent.
    """
    lines = [f"table {family} {TABLE}", f"delete table {family} {TABLE}"]
    if body is not None:
        lines.append(f"table {family} {TABLE} {{\n\tcomment \"tessera:{fp}\"\n{body}}}")
    return "\n".join(lines) + "\n"


def node_table(slots: Iterable) -> str:
    """Bridge-family table: each slot port may send only frames with its own MAC, and IP/ARP with its own IP.

    Hooked at bridge prerouting, so a forged frame is dropped before the bridge
    learns its source MAC. Anything but IPv4 and ARP from a slot is dropped.
    """
    slots = sorted(slots, key=lambda s: s.port)
    vmap = ", ".join(f'"{s.port}" : jump slot_{s.port}' for s in slots)
    out = ["\tchain prerouting {", "\t\ttype filter hook prerouting priority -200; policy accept;",
           f"\t\tiifname vmap {{ {vmap} }}", "\t}"]
    for s in slots:
        out += [f"\tchain slot_{s.port} {{",
                f"\t\tether saddr != {s.mac_address} drop",
                f"\t\tether type arp arp saddr ether {s.mac_address} arp saddr ip {s.ip_address} accept",
                f"\t\tether type ip ip saddr {s.ip_address} accept",
                "\t\tdrop", "\t}"]
    return "\n".join(out) + "\n"


def _ports(rule: SecurityRule) -> str:
    if rule.port_from is None:
        return ""
    return f"{rule.port_from}-{rule.port_to or rule.port_from}"


def flow_rules(src_if: str, dst_if: str, rule: SecurityRule) -> list[str]:
    """The forward and reply rules of one opened flow src -> dst (see the module docstring)."""
    fwd, back = f'iifname "{src_if}" oifname "{dst_if}"', f'iifname "{dst_if}" oifname "{src_if}"'
    ports, tag = _ports(rule), f'comment "rule {rule.id}"'
    if rule.protocol == "icmp":
        return [f"{fwd} icmp type echo-request accept {tag}", f"{back} {ICMP_REPLIES} accept {tag}"]
    if rule.protocol == "any":
        return [f"{fwd} accept {tag}", f"{back} tcp flags & (syn | ack) != syn accept {tag}",
                f"{back} meta l4proto udp accept {tag}", f"{back} {ICMP_REPLIES} accept {tag}"]
    proto = rule.protocol
    dport = f" {proto} dport {ports}" if ports else f" meta l4proto {proto}"
    sport = f" {proto} sport {ports}" if ports else f" meta l4proto {proto}"
    syn = " tcp flags & (syn | ack) != syn" if proto == "tcp" else ""
    return [f"{fwd}{dport} accept {tag}", f"{back}{sport}{syn} accept {tag}"]


def opened_flows(tenant: TenantNetworks) -> list[tuple[int, int, SecurityRule]]:
    """(source vni, destination vni, rule) for every rule between two networks of the tenant.

    An ingress rule on N naming M opens M -> N; an egress rule on N naming M opens
    N -> M. Rules naming a network the snapshot does not hold, or the network
    itself, open nothing.
    """
    vni_of: dict[uuid.UUID, int] = {n.network_id: n.vni for n in tenant.networks}
    flows = []
    for net in tenant.networks:
        for rule in net.rules:
            remote = vni_of.get(rule.remote_network_id) if rule.remote_network_id else None
            if remote is None or remote == net.vni:
                continue
            flows.append((remote, net.vni, rule) if rule.direction == "ingress" else (net.vni, remote, rule))
    return sorted(flows, key=lambda f: (f[0], f[1], str(f[2].id)))


def router_table(tenant: TenantNetworks) -> str:
    """Inet-family table of the tenant's router namespace: forward policy drop, plus the opened flows."""
    out = ["\tchain forward {", "\t\ttype filter hook forward priority 0; policy drop;"]
    for src, dst, rule in opened_flows(tenant):
        out += [f"\t\t{line}" for line in flow_rules(gw_ifname(src), gw_ifname(dst), rule)]
    out.append("\t}")
    return "\n".join(out) + "\n"
