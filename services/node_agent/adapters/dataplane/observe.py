"""Read back the kernel objects a node owns, with the same fingerprints ``DesiredNode.objects`` computes.

Ownership is recognised by name prefix and IFLA_IFALIAS ``tessera:<kind>:<id>``
for links, by the ``ts-<tag>-`` / ``tr-<tag>-`` prefix for namespaces and by
the table name ``tessera`` (its comment holds the rules' fingerprint) for nft.
Blocks: one netlink dump, one per slot namespace, one ``nft`` run per namespace.
"""
from __future__ import annotations

import json
import re
import subprocess
import uuid

from pyroute2 import netns

from ...domain.dataplane.model import slot_fp, tap_fp
from ...domain.dataplane.names import ALIAS_PREFIX, SLOT_IFNAME, slot_netns
from .kernel import Kernel, KernelError

TABLE_FP = re.compile(r'table (\w+) tessera \{\s*comment "tessera:(\w*)"')


def _linkinfo(link, attr: str):
    data = link.get(("IFLA_LINKINFO", "IFLA_INFO_DATA"))
    return data.get(attr) if data is not None else None


def _slot_peer(ns: str) -> tuple[str | None, str | None]:
    """(mac, ip/prefix) of eth0 inside a slot namespace; (None, None) when it or the namespace is missing."""
    proc = subprocess.run(["ip", "-n", ns, "-j", "addr", "show", "dev", SLOT_IFNAME], capture_output=True, text=True,
                          timeout=30, check=False)
    if proc.returncode != 0:
        return None, None
    [link] = json.loads(proc.stdout) or [{}]
    addrs = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("family") == "inet"]
    return link.get("address"), (",".join(sorted(addrs)) or None)


def owned_links(kernel: Kernel) -> dict[tuple[str, str], str]:
    """Owned links of the node namespace: (kind, name) -> fingerprint."""
    links = kernel.ipr.get_links()
    names = {link["index"]: link.get("IFLA_IFNAME") for link in links}
    found: dict[tuple[str, str], str] = {}
    for link in links:
        tag = link.get("IFLA_IFALIAS") or ""
        if not tag.startswith(ALIAS_PREFIX + ":"):
            continue
        _, kind, ident = tag.split(":", 2)
        name, master = link.get("IFLA_IFNAME"), names.get(link.get("IFLA_MASTER"))
        if kind == "vxlan":
            found[(kind, name)] = (f"vni={_linkinfo(link, 'IFLA_VXLAN_ID')} group={_linkinfo(link, 'IFLA_VXLAN_GROUP')} "
                                   f"master={master}")
        elif kind == "leg":
            found[(kind, name)] = f"master={master}"
        elif kind == "slot" and link.get(("IFLA_LINKINFO", "IFLA_INFO_KIND")) == "tun":   # a VM's tap
            found[(kind, name)] = tap_fp(master)
        elif kind == "slot":
            ns = slot_netns(kernel.tag, uuid.UUID(ident))
            found[(kind, ns)] = slot_fp(master, *_slot_peer(ns))
        else:
            found[(kind, name)] = ""
    return found


def _table_fp(kernel: Kernel, ns: str | None, family: str) -> str | None:
    for fam, fp in TABLE_FP.findall(kernel.run_in(ns, ["nft", "list", "ruleset"])):
        if fam == family:
            return fp
    return None


def observe(kernel: Kernel) -> dict[tuple[str, str], str]:
    """Every owned object of the node as (kind, name) -> fingerprint; raises KernelError."""
    found = owned_links(kernel)
    spaces = netns.listnetns()
    for ns in spaces:
        if ns.startswith(f"tr-{kernel.tag}-"):
            found[("router", ns)] = ""
            fp = _table_fp(kernel, ns, "inet")
            if fp is not None:
                found[("nft_router", ns)] = fp
        elif ns.startswith(f"ts-{kernel.tag}-") and ("slot", ns) not in found:
            found[("slot", ns)] = slot_fp(None, None, None)   # a namespace whose port is gone
    fp = _table_fp(kernel, None, "bridge")
    if fp is not None:
        found[("nft_node", "node")] = fp
    return found


__all__ = ["KernelError", "observe", "owned_links"]
