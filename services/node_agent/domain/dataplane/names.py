"""Names, addresses and fingerprints of the kernel objects a node-agent owns: pure, deterministic.

Link names stay within the kernel's 15 characters and carry a prefix (tbr, tvx,
tlg, tv) so the agent recognises its own; namespaces carry the node's tag so
several nodes can share one kernel (tests, the benchmark).
"""
from __future__ import annotations

import hashlib
import uuid

from shared.slots import node_tag, slot_netns  # noqa: F401 - names other services find slots by, re-exported
from shared.vxlan import vxlan_group  # noqa: F401 - the fabric's convention, re-exported for the dataplane

ALIAS_PREFIX = "tessera"
SLOT_IFNAME = "eth0"


def vni_hex(vni: int) -> str:
    return f"{vni:06x}"


def bridge_name(vni: int) -> str:
    return f"tbr{vni_hex(vni)}"


def vxlan_name(vni: int) -> str:
    return f"tvx{vni_hex(vni)}"


def leg_name(vni: int) -> str:
    return f"tlg{vni_hex(vni)}"


def gw_ifname(vni: int) -> str:
    return f"gw{vni_hex(vni)}"


def slot_port_name(attachment_id: uuid.UUID) -> str:
    return f"tv{attachment_id.hex[:8]}"


def router_netns(tag: str, tenant_id: uuid.UUID) -> str:
    return f"tr-{tag}-{tenant_id.hex[:12]}"


def alias(kind: str, ident: object) -> str:
    return f"{ALIAS_PREFIX}:{kind}:{ident}"


def gateway_mac(tag: str, vni: int) -> str:
    """Locally administered, unique per node and network (see the module docstring for why per node)."""
    digest = hashlib.sha256(f"{tag}:{vni}".encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in digest[:5])


def fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]




def port_of_slot_netns(ns: str) -> str:
    """The slot port name of slot namespace ``ts-<tag>-<attachment 12 hex>`` (both derive from the attachment)."""
    return "tv" + ns.rsplit("-", 1)[1][:8]
