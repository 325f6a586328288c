"""A throwaway lab for tests and the benchmark: node namespaces joined by an underlay bridge.

``Lab(n)`` makes a fabric namespace holding bridge ``ul`` and, per node, a
namespace with veth ``ul0`` (10.255.0.<i>/24) plugged into it. Everything is
named ``tl<suffix>-...`` with a random suffix, so runs never collide, and
``destroy`` removes the lab plus every namespace the nodes' dataplanes made
(``ts-<tag>-`` / ``tr-<tag>-``). Requires root; blocks.

A test and benchmark helper kept beside the kernel adapter it drives: no service code imports it.
"""
from __future__ import annotations

import os
import uuid

from pyroute2 import IPRoute, netns

from ...domain.dataplane.names import node_tag
from .kernel import Kernel
from .node import KernelDataplane

UNDERLAY_DEV = "ul0"


def is_root() -> bool:
    return os.geteuid() == 0


class Lab:
    """``dataplanes=False``: only the namespaces, for node-agent processes that drive the nodes themselves
    (set ``node_ids`` to theirs so ``destroy`` also removes what their dataplanes made)."""

    def __init__(self, nodes: int, *, dataplanes: bool = True, suffix: str | None = None):
        self.with_dataplanes = dataplanes
        self.suffix = suffix or uuid.uuid4().hex[:6]   # given: the same lab again (./taskw up on its data folder)
        self.fabric = f"tl{self.suffix}-fab"
        self.node_ids = [uuid.uuid4() for _ in range(nodes)]
        self.node_ns = [f"tl{self.suffix}-n{i}" for i in range(nodes)]
        self.dataplanes: list[KernelDataplane] = []

    def exists(self) -> bool:
        return self.fabric in netns.listnetns()

    def build(self) -> Lab:
        try:
            self._build()
        except Exception:
            self.destroy()
            raise
        return self

    def _build(self) -> None:
        netns.create(self.fabric)
        with IPRoute(netns=self.fabric) as fab:
            fab.link("add", ifname="ul", kind="bridge", br_mcast_snooping=0, br_stp_state=0, br_forward_delay=0)
            fab.link("set", index=fab.link_lookup(ifname="ul")[0], state="up")
            for i, ns in enumerate(self.node_ns):
                netns.create(ns)
                fab.link("add", ifname=f"p{i}", kind="veth", peer={"ifname": UNDERLAY_DEV, "net_ns_fd": ns})
                port = fab.link_lookup(ifname=f"p{i}")[0]
                fab.link("set", index=port, master=fab.link_lookup(ifname="ul")[0], state="up")
                with IPRoute(netns=ns) as node:
                    dev = node.link_lookup(ifname=UNDERLAY_DEV)[0]
                    node.addr("add", index=dev, address=f"10.255.0.{i + 1}", prefixlen=24)
                    node.link("set", index=dev, state="up")
                    node.link("set", index=node.link_lookup(ifname="lo")[0], state="up")
        for node_id, ns in zip(self.node_ids, self.node_ns):
            if not self.with_dataplanes:
                break
            self.dataplanes.append(KernelDataplane(Kernel(node_tag(node_id), ns, UNDERLAY_DEV)))

    def destroy(self) -> None:
        """Remove every namespace of the lab and of its nodes' dataplanes (idempotent, never raises)."""
        for dp in self.dataplanes:
            dp.close()
        prefixes = (f"tl{self.suffix}-",) + tuple(p for i in self.node_ids for p in (f"ts-{node_tag(i)}-", f"tr-{node_tag(i)}-"))
        for ns in netns.listnetns():
            if ns.startswith(prefixes):
                try:
                    netns.remove(ns)
                except OSError:
                    pass
