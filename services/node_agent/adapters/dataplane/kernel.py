"""The only place that changes the kernel: pyroute2 (one netlink socket in the node's namespace) for
links; ``ip netns add/del`` and ``ip -n NS -b -`` for namespaces and the addresses/routes inside a
slot or router namespace (a process costs ~5 ms, a pyroute2 socket per namespace ~35 ms); the ``nft``
binary (``nft -f -``, inside the right namespace via ``ip netns exec``) for rules.

Every method blocks (netlink round trips, a subprocess for nft) and is
idempotent: a create replaces what is there under the name (a bridge is kept,
it carries other ports), a remove of something absent does nothing. A create
that fails midway removes what it made before raising ``KernelError``. Not
thread-safe: the dataplane serialises calls.
"""
from __future__ import annotations

import socket
import subprocess

import pyroute2.config
from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from shared.vxlan import VXLAN_OVERHEAD, VXLAN_PORT

from ...domain.dataplane.model import Segment, SlotPort
from ...domain.dataplane.names import (
    ALIAS_PREFIX,
    SLOT_IFNAME,
    alias,
    bridge_name,
    gw_ifname,
    leg_name,
    vxlan_group,
    vxlan_name,
)
from ...domain.dataplane.render import table_script

# pyroute2 enters a namespace in a forked child and stops it with SIGTERM: the child must die of it, not run
# the parent's inherited handlers (which would stop the parent: its wakeup socket is shared). A setting, not I/O.
pyroute2.config.disable_mp_signal = True

MAX_GROUPS = 4096   # tenant networks one node can carry (one multicast group each)


class KernelError(RuntimeError):
    """A kernel operation failed; str(exc) names the object and the kernel's reason."""


class Kernel:
    """The kernel of one node: its links live in ``node_netns`` (None: this process's namespace)."""

    def __init__(self, tag: str, node_netns: str | None = None, underlay_dev: str | None = None):
        self.tag, self.node_netns, self.underlay_dev = tag, node_netns, underlay_dev
        self._ipr: IPRoute | None = None
        self.underlay_index = 0
        self.mtu = 1500

    # -- plumbing ---------------------------------------------------------------------------------------
    @property
    def ipr(self) -> IPRoute:
        """The node namespace's netlink socket, opened on first use; raises KernelError on a bad underlay."""
        if self._ipr is None:
            # no multicast groups: a busy node would overflow the socket with events nobody reads (ENOBUFS)
            self._ipr = IPRoute(netns=self.node_netns, groups=0) if self.node_netns else IPRoute(groups=0)
            self._find_underlay()
            self._raise_group_limit()
        return self._ipr

    def _raise_group_limit(self) -> None:
        """Every VXLAN device joins its multicast group through the one UDP socket of port 4789, and the
        kernel caps a socket's IGMP memberships (net.ipv4.igmp_max_memberships, default 20): without
        raising it the node could carry only 20 tenant networks (the 21st fails with ENOBUFS)."""
        current = int(self.run_in(None, ["sysctl", "-n", "net.ipv4.igmp_max_memberships"]).strip())
        if current < MAX_GROUPS:
            self.run_in(None, ["sysctl", "-qw", f"net.ipv4.igmp_max_memberships={MAX_GROUPS}"])

    def _find_underlay(self) -> None:
        if self.underlay_dev is None:
            default = [r for r in self._ipr.get_routes(family=socket.AF_INET) if r["dst_len"] == 0]
            if not default:
                raise KernelError("no underlay device: the node has no default route; set TESSERA_NODE_UNDERLAY_DEV")
            self.underlay_index = default[0].get("RTA_OIF")
        else:
            found = self._ipr.link_lookup(ifname=self.underlay_dev)
            if not found:
                raise KernelError(f"underlay device {self.underlay_dev!r} does not exist in the node's namespace")
            self.underlay_index = found[0]
        self.mtu = self._ipr.get_links(self.underlay_index)[0].get("IFLA_MTU") - VXLAN_OVERHEAD

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None

    def index(self, name: str) -> int | None:
        found = self.ipr.link_lookup(ifname=name)
        return found[0] if found else None

    def _nl(self, what: str, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except NetlinkError as exc:
            raise KernelError(f"{what}: {exc}") from exc

    def run_in(self, ns: str | None, argv: list[str], stdin: str | None = None) -> str:
        """Run a command inside namespace ``ns`` (None: the node's); raises KernelError with its stderr."""
        ns = ns or self.node_netns
        full = (["ip", "netns", "exec", ns] if ns else []) + argv
        proc = subprocess.run(full, input=stdin, capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode != 0:
            raise KernelError(f"{' '.join(argv[:3])} in {ns or 'the node namespace'}: {proc.stderr.strip()[:500]}")
        return proc.stdout

    # -- namespaces -------------------------------------------------------------------------------------
    def ensure_netns(self, name: str, lo_up: bool = True) -> None:
        """Create the namespace if missing (``ip netns add``: a fifth of pyroute2's cost) with lo up
        (``lo_up=False``: the caller's own ``ip_batch`` brings it up)."""
        if name not in netns.listnetns():
            proc = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=30, check=False)
            if proc.returncode != 0 and name not in netns.listnetns():
                raise KernelError(f"create namespace {name}: {proc.stderr.strip()}")
        if lo_up:
            self.ip_batch(name, ["link set lo up"])

    def ip_batch(self, ns: str, commands: list[str]) -> None:
        """Run ``ip`` commands inside ``ns`` in one process (``ip -n NS -b -``); raises KernelError.

        Entering a namespace through pyroute2 costs ~35 ms a socket; one ``ip`` process ~5 ms."""
        proc = subprocess.run(["ip", "-n", ns, "-b", "-"], input="\n".join(commands) + "\n",
                              capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode != 0:
            raise KernelError(f"in {ns}: {proc.stderr.strip()[:500]}")

    def remove_netns(self, name: str) -> None:
        if name in netns.listnetns():
            proc = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True, timeout=30, check=False)
            if proc.returncode != 0 and name in netns.listnetns():
                raise KernelError(f"remove namespace {name}: {proc.stderr.strip()}")

    def ensure_router(self, name: str) -> None:
        """The tenant's router namespace with forwarding on (no rules yet: forward policy is the table's)."""
        self.ensure_netns(name)
        try:
            self.run_in(name, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        except KernelError:
            self.remove_netns(name)
            raise

    # -- links ------------------------------------------------------------------------------------------
    def _owned(self, idx: int) -> tuple[bool, str]:
        owner = self.ipr.get_links(idx)[0].get("IFLA_IFALIAS") or ""
        return owner.startswith(ALIAS_PREFIX + ":"), owner

    def _clear(self, name: str) -> None:
        """Remove an owned link under ``name`` before re-creating it; raises KernelError if the name is
        taken by a link tessera does not own (never removed: it is someone else's)."""
        idx = self.index(name)
        if idx is None:
            return
        owned, owner = self._owned(idx)
        if not owned:
            raise KernelError(f"{name} exists and is not owned by tessera (alias {owner!r})")
        self.remove_link(name)

    def remove_link(self, name: str) -> None:
        """Remove the link if it is there AND owned (a foreign link under an owned name is left alone)."""
        idx = self.index(name)
        if idx is not None and self._owned(idx)[0]:
            try:
                self.ipr.link("del", index=idx)
            except NetlinkError as exc:
                if exc.code != 19:   # ENODEV: gone meanwhile
                    raise KernelError(f"remove {name}: {exc}") from exc

    def _add(self, name: str, owner: str, **spec) -> None:
        """Create a link and mark it owned at once (the kernel takes no alias at creation)."""
        self._nl(f"create {name}", self.ipr.link, "add", ifname=name, **spec)
        try:
            self.ipr.link("set", index=self.index(name), ifalias=owner)
        except Exception as exc:
            self.ipr.link("del", ifname=name)
            raise KernelError(f"mark {name} owned: {exc!r}") from exc

    def _enslave(self, name: str, bridge: str) -> None:
        master = self.index(bridge)
        if master is None:
            raise KernelError(f"{name}: bridge {bridge} is missing")
        self._nl(f"set {name}", self.ipr.link, "set", index=self.index(name), master=master, mtu=self.mtu, state="up")

    def ensure_bridge(self, seg: Segment) -> None:
        name = bridge_name(seg.vni)
        idx = self.index(name)
        if idx is not None and not self._owned(idx)[0]:
            raise KernelError(f"{name} exists and is not owned by tessera")
        if idx is None:
            self._add(name, alias("bridge", seg.network_id), kind="bridge", br_stp_state=0, br_forward_delay=0)
        self._nl(f"set {name}", self.ipr.link, "set", index=self.index(name), state="up")

    def ensure_vxlan(self, seg: Segment) -> None:
        name = vxlan_name(seg.vni)
        self._clear(name)
        self._add(name, alias("vxlan", seg.network_id), kind="vxlan", vxlan_id=seg.vni, vxlan_group=vxlan_group(seg.vni),
                  vxlan_link=self.underlay_index, vxlan_port=VXLAN_PORT, vxlan_learning=1)
        self._made(name, lambda: self._enslave(name, bridge_name(seg.vni)))

    def _made(self, name: str, configure) -> None:
        """Run ``configure`` on a link just created; on failure remove the link (nothing half-made)."""
        try:
            configure()
        except Exception:
            self.remove_link(name)
            raise

    def ensure_leg(self, seg: Segment) -> None:
        name, peer = leg_name(seg.vni), gw_ifname(seg.vni)
        self._clear(name)
        self._add(name, alias("leg", f"{seg.tenant_id}/{seg.vni}"), kind="veth",
                  peer={"ifname": peer, "net_ns_fd": seg.router_ns, "address": seg.gateway_mac, "mtu": self.mtu})

        def configure():
            self._enslave(name, bridge_name(seg.vni))
            self._configure_peer(seg.router_ns, peer, seg.gateway_ip, seg.prefix_len, gateway=None)
        self._made(name, configure)

    def ensure_slot(self, slot: SlotPort) -> None:
        """The slot's namespace and veth (peer ``eth0`` inside it with the slot's MAC, IP and default route)."""
        self._clear(slot.port)
        self.ensure_netns(slot.netns, lo_up=False)
        try:
            self._add(slot.port, alias("slot", slot.attachment_id), kind="veth",
                      peer={"ifname": SLOT_IFNAME, "net_ns_fd": slot.netns, "address": slot.mac_address, "mtu": self.mtu})
            self._enslave(slot.port, bridge_name(slot.vni))
            self._configure_peer(slot.netns, SLOT_IFNAME, slot.ip_address, slot.prefix_len, gateway=slot.gateway_ip,
                                 extra=["link set lo up"])
        except Exception:
            self.remove_slot(slot.netns, slot.port)
            raise

    def plug_tap(self, slot: SlotPort) -> bool:
        """Put a VM's tap (made by the hypervisor, in its namespace: this process's) into the node's namespace
        when they differ, mark it owned and plug it into the slot's bridge; False when no such tap exists (the VM
        is not running: nothing to plug yet). Raises KernelError."""
        if self.index(slot.port) is None:
            if not self.node_netns:
                return False
            with IPRoute(groups=0) as here:
                found = here.link_lookup(ifname=slot.port)
                if not found:
                    return False
                try:
                    here.link("set", index=found[0], net_ns_fd=self.node_netns)
                except NetlinkError as exc:
                    raise KernelError(f"move {slot.port} into {self.node_netns}: {exc}") from exc
        idx = self.index(slot.port)
        if idx is None:
            return False
        self._nl(f"mark {slot.port} owned", self.ipr.link, "set", index=idx, ifalias=alias("slot", slot.attachment_id))
        self._enslave(slot.port, bridge_name(slot.vni))
        return True

    def unplug_tap(self, name: str) -> None:
        """Take a VM's tap off its bridge and down (never delete it: its VM holds it; removing the VM removes
        it). Idempotent; a tap that is not tessera's is left alone."""
        idx = self.index(name)
        if idx is not None and self._owned(idx)[0]:
            self._nl(f"unplug {name}", self.ipr.link, "set", index=idx, master=0, state="down")

    def tap_plugged_before(self, name: str) -> bool:
        """A tap of that name in the node's namespace that the node has plugged before (marked owned): the
        reconcile's to keep plugged. A fresh one (its VM just started) is its provision's or start's to plug."""
        idx = self.index(name)
        return idx is not None and self._owned(idx)[0]

    def _configure_peer(self, ns: str, ifname: str, ip: str, prefix: int, gateway: str | None,
                        extra: list[str] = ()) -> None:
        commands = [*extra, f"addr replace {ip}/{prefix} dev {ifname}", f"link set {ifname} up"]
        if gateway:
            commands.append(f"route replace default via {gateway} dev {ifname}")
        self.ip_batch(ns, commands)

    def remove_slot(self, ns: str, port: str) -> None:
        self.remove_link(port)
        self.remove_netns(ns)

    # -- rules ------------------------------------------------------------------------------------------
    def apply_nft(self, ns: str | None, family: str, body: str | None, fp: str = "") -> None:
        """Replace (body None: delete) table ``family tessera`` in ``ns`` atomically (one nft transaction)."""
        if body is None and ns is not None and ns not in netns.listnetns():
            return
        self.run_in(ns, ["nft", "-f", "-"], stdin=table_script(family, body, fp))
