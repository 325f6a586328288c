"""A real fabric driver for Linux leaf switches (SONiC, Cumulus Linux): it programs the leaf's kernel with iproute2.

What the EVPN renderer describes for a leaf — a network's VNI on a VXLAN device mapped to a leaf-local VLAN, a
server port an access port of a VLAN — this driver does, in traditional bridge mode (a bridge per VLAN:
``domain.leaf``), on the leaves it is given
(``TESSERA_NETWORK_LEAF_NETNS``: leaf name → the network namespace holding it; a production deployment would reach a
switch over SSH or its agent, the commands stay the same). Leaves it is not given are left to the other drivers.

It is declarative: each change (an attachment arriving or leaving, a port bound or unbound) makes the leaf match
what the network service's tables hold for it, read in the change's transaction under a per-leaf lock, so two
changes on one leaf never interleave and a leaf that drifted is repaired by the next change. The commands it ran
are recorded in ``fabric_calls`` (method ``EXEC``). Before a server's port joins its tenant network, the leaf probes
that network for the server's address (``dad``: an ARP probe, RFC 5227): an address another host already answers for
is refused, and the port stays where it was. What no command can fix (no such namespace, bridge or port) or
a command the kernel refuses raises FabricRefused with the leaf's words; the caller rolls its transaction back and
calls ``settle`` so the leaf follows the database again (nothing of the refused change is left on it).
"""
from __future__ import annotations

import dataclasses
import json

import asyncpg
import structlog

from ...domain.leaf import (
    BRIDGE_ALIAS,
    UNDERLAY,
    VXLAN_ALIAS,
    LeafRefusal,
    LeafState,
    LeafWant,
    check,
    plan,
    vlan_bridge,
)
from .base import FabricCall, FabricChange, FabricDriver, FabricRefused, PortChange, record
from .dad import address_in_use
from .leafshell import run

log = structlog.get_logger()


class LeafDriver(FabricDriver):
    name = "leaf"

    def __init__(self, netns: dict[str, str] | None = None, provisioning_vlan: int = 4094):
        self.netns = dict(netns or {})
        self.provisioning_vlan = provisioning_vlan

    # the renderers have nothing to say: the leaf's commands come from its state (``sync``)
    def attach_calls(self, change: FabricChange) -> list[FabricCall]:
        return []

    def detach_calls(self, change: FabricChange) -> list[FabricCall]:
        return []

    async def apply(self, conn: asyncpg.Connection, action, change: FabricChange) -> list[FabricCall]:
        if change.leaf not in self.netns:
            return []
        calls = await self.sync(conn, change.leaf)
        await record(conn, self.name, action, change, calls)
        return calls

    async def move_port(self, conn: asyncpg.Connection, action, change: PortChange) -> list[FabricCall]:
        if change.leaf not in self.netns:
            return []
        calls = []
        if action == "bind" and change.address:
            # the network's segment first, the port still on the provisioning VLAN: is the address free there?
            calls = await self.sync(conn, change.leaf, hold=(change.port,))
            holder = await address_in_use(change.leaf, self.netns[change.leaf], vlan_bridge(change.vlan),
                                          change.address)
            if holder is not None:
                raise FabricRefused(f"address {change.address} is already in use on the tenant network "
                                    f"(answered by {holder})")
        calls += await self.sync(conn, change.leaf, restore=(change.port,) if action == "unbind" else ())
        await record(conn, self.name, action, change, calls)
        return calls

    async def settle(self, conn: asyncpg.Connection, leaf: str, restore: tuple[str, ...] = ()) -> None:
        if leaf not in self.netns:
            return
        try:
            await self.sync(conn, leaf, restore=restore, lenient=True)
        except FabricRefused as exc:   # the next change on the leaf tries again
            log.warning("leaf.settle_failed", leaf=leaf, reason=exc.reason)

    # -- the leaf's state ----------------------------------------------------------------------------------------
    async def sync(self, conn: asyncpg.Connection, leaf: str, restore: tuple[str, ...] = (),
                   lenient: bool = False, hold: tuple[str, ...] = ()) -> list[FabricCall]:
        """Make ``leaf`` carry what the tables hold for it (``restore``: ports to return to the provisioning VLAN;
        ``lenient``: those the leaf does not have are left out; ``hold``: bound ports not to move yet); returns the
        commands run. Raises FabricRefused."""
        ns = self.netns[leaf]
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"network.leaf:{leaf}")
        state = await self._read(leaf, ns)
        want = await _wanted(conn, leaf, tuple(p for p in restore if not lenient or p in state.masters))
        try:
            check(state, want, self.provisioning_vlan)   # a held port too: refused before anything is made
            want = dataclasses.replace(want, ports={p: v for p, v in want.ports.items() if p not in hold})
        except LeafRefusal as exc:
            raise FabricRefused(f"leaf {leaf} {exc}") from None
        cmds = plan(state, want, self.provisioning_vlan)
        for argv in cmds:
            await run(leaf, ns, argv)
        if cmds:
            log.info("leaf.synced", leaf=leaf, commands=len(cmds))
        return [FabricCall("EXEC", f"netns:{ns}", {"argv": argv}) for argv in cmds]

    async def _read(self, leaf: str, ns: str) -> LeafState:
        links = json.loads(await run(leaf, ns, ["ip", "-j", "-d", "link", "show"]) or "[]")
        masters, vxlans, bridges, underlay_mtu = {}, {}, set(), 1500
        for link in links:
            name, alias = link["ifname"], str(link.get("ifalias", ""))
            if name == "lo":
                continue
            masters[name] = link.get("master")
            if link.get("linkinfo", {}).get("info_kind") == "vxlan" and alias.startswith(VXLAN_ALIAS):
                vxlans[int(link["linkinfo"]["info_data"]["id"])] = name
            if alias.startswith(BRIDGE_ALIAS):
                bridges.add(name)
            if name == UNDERLAY:
                underlay_mtu = int(link.get("mtu", 1500))
        return LeafState(masters, vxlans, frozenset(bridges), underlay_mtu)


async def _wanted(conn: asyncpg.Connection, leaf: str, restore: tuple[str, ...]) -> LeafWant:
    segments = await conn.fetch(
        "SELECT DISTINCT n.vni, l.value AS vlan, n.id FROM attachments a JOIN tenant_networks n ON n.id = a.network_id "
        "JOIN pool_leases l ON l.pool = 'vlan:' || a.leaf AND l.owner = a.network_id WHERE a.leaf = $1", leaf)
    ports = await conn.fetch("SELECT port, vlan FROM port_bindings WHERE leaf = $1", leaf)
    return LeafWant({r["vni"]: (int(r["vlan"]), r["id"]) for r in segments},
                    {r["port"]: r["vlan"] for r in ports}, frozenset(restore))
