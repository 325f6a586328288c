"""Ethernet/EVPN leaf switches, configured with NVIDIA NVUE's declarative JSON (Cumulus Linux REST API).

Per tenant, on every leaf serving one of its slots: a VRF named ``vrf-<table>`` with the
tenant's route-table id and its L3 VNI (symmetric IRB). Per network, on such a leaf: a
leaf-local VLAN mapped to the network's L2 VNI in bridge domain ``br_default``, and an SVI
in the tenant's VRF holding the network's gateway address (a distributed gateway: the
same address on every leaf). Each change is one ``PATCH https://<leaf>:8765/nvue_v1/``
whose body is a JSON merge patch (RFC 7396) of the NVUE configuration tree: objects add,
``null`` removes. (A production driver would wrap it in NVUE's revision create/apply.) A bare-metal server's port
is an access port of the provisioning VLAN until hand-off, of its network's VLAN while the tenant holds it, and of
the provisioning VLAN again for cleaning (``nv set interface swpN bridge domain br_default access <vlan>``).
"""
from __future__ import annotations

from .base import FabricCall, FabricChange, FabricDriver, PortChange

BRIDGE_DOMAIN = "br_default"


def vrf_name(vrf_table: int) -> str:
    """At most 14 characters (Linux interface names are limited to 15) and unique, as table ids are."""
    return f"vrf-{vrf_table}"


class EvpnNvueDriver(FabricDriver):
    name = "evpn"

    def __init__(self, port: int = 8765, provisioning_vlan: int = 4094):
        self.port = port
        self.provisioning_vlan = provisioning_vlan

    def _url(self, leaf: str) -> str:
        return f"https://{leaf}:{self.port}/nvue_v1/"

    @staticmethod
    def _vrf(c: FabricChange) -> dict:
        return {vrf_name(c.vrf_table): {"table": c.vrf_table, "evpn": {"enable": "on", "vni": {str(c.l3_vni): {}}},
                                        "router": {"bgp": {"enable": "on"}}}}

    @staticmethod
    def _network(c: FabricChange) -> tuple[dict, dict]:
        bridge = {"domain": {BRIDGE_DOMAIN: {"vlan": {str(c.vlan): {"vni": {str(c.vni): {}}}}}}}
        svi = {f"vlan{c.vlan}": {"type": "svi", "vlan": c.vlan,
                                 "ip": {"vrf": vrf_name(c.vrf_table),
                                        "address": {f"{c.gateway_ip}/{c.cidr.prefixlen}": {}}}}}
        return bridge, svi

    def attach_calls(self, c: FabricChange) -> list[FabricCall]:
        body: dict = {}
        if c.tenant_alone_on_leaf:
            body["vrf"] = self._vrf(c)
        if c.network_alone_on_leaf:
            body["bridge"], body["interface"] = self._network(c)
        return [FabricCall("PATCH", self._url(c.leaf), body)] if body else []

    def detach_calls(self, c: FabricChange) -> list[FabricCall]:
        body: dict = {}
        if c.network_alone_on_leaf:
            body["bridge"] = {"domain": {BRIDGE_DOMAIN: {"vlan": {str(c.vlan): None}}}}
            body["interface"] = {f"vlan{c.vlan}": None}
        if c.tenant_alone_on_leaf:
            body["vrf"] = {vrf_name(c.vrf_table): None}
        return [FabricCall("PATCH", self._url(c.leaf), body)] if body else []

    def _access(self, c: PortChange, vlan: int) -> list[FabricCall]:
        body = {"interface": {c.port: {"bridge": {"domain": {BRIDGE_DOMAIN: {"access": vlan}}}}}}
        return [FabricCall("PATCH", self._url(c.leaf), body)]

    def bind_calls(self, c: PortChange) -> list[FabricCall]:
        return self._access(c, c.vlan)

    def unbind_calls(self, c: PortChange) -> list[FabricCall]:
        return self._access(c, self.provisioning_vlan)
