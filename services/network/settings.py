"""Network's own settings: the provider's network plan and the fabric drivers.

Read from the environment once, in bootstrap (never at import time); a bad value raises ``SettingError``
naming the variable. Variables (defaults in brackets):
  TESSERA_NETWORK_VNI_MIN / _VNI_MAX     [10000–16777215] VNI pool: network VNIs and tenants' L3 VNIs
  TESSERA_NETWORK_VRF_MIN / _VRF_MAX     [1000–64999] route-table / VRF id pool, one per tenant
  TESSERA_NETWORK_PKEY_MIN / _PKEY_MAX   [0x0001–0x7FFE] InfiniBand PKey pool, one per tenant (hex or decimal)
  TESSERA_NETWORK_NAT_CIDR               [198.51.100.0/24] NAT gateway addresses, one per tenant network
  TESSERA_NETWORK_TENANT_CIDR            [10.0.0.0/24] first choice (and size) of the subnet of a tenant's implicit
                                         "default" network, created when an allocation names no network
  TESSERA_NETWORK_DEFAULT_POOL           [10.0.0.0/8] where that subnet is drawn from when a network of the tenant
                                         overlaps the first choice: the lowest free one of TENANT_CIDR's size
  TESSERA_NETWORK_LEAF_MAP               [none] "<node uuid>=<leaf>,..." nodes → leaf switch (others: a deterministic leaf)
  TESSERA_NETWORK_LEAF_COUNT             [4] leaves the deterministic mapping spreads nodes over
  TESSERA_NETWORK_FABRIC                 [evpn,infiniband] fabric drivers, comma-separated, or none
  TESSERA_NETWORK_UFM_URL                [the driver's] base URL of the UFM the InfiniBand driver addresses
  TESSERA_NETWORK_LEAF_NETNS             [none] "<leaf>=<netns>,...": the Linux leaves the kernel driver ("leaf")
                                         programs, each in its network namespace
  TESSERA_NETWORK_PROVISIONING_VLAN      [4094] the leaves' provisioning VLAN: bare-metal server ports are on it for
                                         deploy and cleaning (never leased to a tenant network)
"""
from __future__ import annotations

import ipaddress
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from shared.settings import SettingError, integer, load, setting

from .adapters.fabric import DRIVERS as FABRIC_DRIVERS
from .domain.model import (
    DEFAULT_NAT_CIDR,
    DEFAULT_POOL,
    DEFAULT_TENANT_CIDR,
    VNI_MAX,
    IdPool,
    LeafMap,
    NetworkPlan,
    PKeyPool,
    VniPool,
    VrfPool,
)

P = "TESSERA_NETWORK_"
ident = integer()   # decimal, or hex with 0x


def _subnet(text: str) -> ipaddress.IPv4Network:
    net = ipaddress.IPv4Network(text)
    if net.prefixlen > 30:
        raise ValueError(text)
    return net


_subnet.what = "an IPv4 subnet (network address/prefix) with at least two host addresses"   # type: ignore[attr-defined]


def _leaf_map(text: str) -> dict[uuid.UUID, str]:
    out = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        node, sep, leaf = item.partition("=")
        if not sep or not leaf.strip():
            raise ValueError(item)
        out[uuid.UUID(node.strip())] = leaf.strip()
    return out


_leaf_map.what = "a list '<node uuid>=<leaf>,...'"   # type: ignore[attr-defined]


def _fabric(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if names == ("none",):
        return ()
    if not names or any(n not in FABRIC_DRIVERS for n in names):
        raise ValueError(text)
    return names


def _leaf_netns(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        leaf, sep, ns = item.partition("=")
        if not sep or not leaf.strip() or not ns.strip() or "/" in ns:
            raise ValueError(item)
        out[leaf.strip()] = ns.strip()
    return out


_leaf_netns.what = "a list '<leaf>=<network namespace>,...'"   # type: ignore[attr-defined]


_fabric.what = (   # type: ignore[attr-defined]
    f"a comma-separated list of fabric drivers ({', '.join(sorted(FABRIC_DRIVERS))}) or 'none'")


@dataclass(frozen=True)
class NetworkSettings:
    """The provider's network plan (pools, subnets, leaves) and the fabric drivers to program."""

    vni_min: int = setting(P + "VNI_MIN", VniPool.first, ident, doc="lowest VNI handed out (networks, L3 VNIs)")
    vni_max: int = setting(P + "VNI_MAX", VNI_MAX, ident, doc="highest VNI handed out")
    vrf_min: int = setting(P + "VRF_MIN", VrfPool.first, ident, doc="lowest route-table / VRF id, one per tenant")
    vrf_max: int = setting(P + "VRF_MAX", VrfPool.last, ident, doc="highest route-table / VRF id")
    pkey_min: int = setting(P + "PKEY_MIN", PKeyPool.first, ident, doc="lowest InfiniBand PKey, one per tenant")
    pkey_max: int = setting(P + "PKEY_MAX", PKeyPool.last, ident, doc="highest InfiniBand PKey")
    nat_cidr: ipaddress.IPv4Network = setting(P + "NAT_CIDR", DEFAULT_NAT_CIDR, _subnet,
                                              doc="NAT gateway addresses, one per tenant network")
    tenant_cidr: ipaddress.IPv4Network = setting(P + "TENANT_CIDR", DEFAULT_TENANT_CIDR, _subnet,
                                                 doc="first choice (and size) of the subnet of a tenant's "
                                                     "implicit default network")
    default_pool: ipaddress.IPv4Network = setting(P + "DEFAULT_POOL", DEFAULT_POOL, _subnet,
                                                  doc="where a default network's subnet is drawn from when the "
                                                      "first choice overlaps a network of the tenant")
    leaf_map: dict[uuid.UUID, str] = setting(P + "LEAF_MAP", read=_leaf_map, default_factory=dict,
                                             doc="'<node uuid>=<leaf>,...': nodes → leaf switch")
    leaf_count: int = setting(P + "LEAF_COUNT", 4, integer(1, 9999),
                              doc="leaves the deterministic node → leaf mapping spreads nodes over")
    fabric: tuple[str, ...] = setting(P + "FABRIC", ("evpn", "infiniband"), _fabric,
                                      doc="fabric drivers, comma-separated, or none")
    ufm_url: str | None = setting(P + "UFM_URL", None, doc="base URL of the UFM the InfiniBand driver addresses")
    leaf_netns: dict[str, str] = setting(P + "LEAF_NETNS", read=_leaf_netns, default_factory=dict,
                                         doc="'<leaf>=<netns>,...': the Linux leaves the kernel driver programs")
    provisioning_vlan: int = setting(P + "PROVISIONING_VLAN", 4094, integer(2, 4094),
                                     doc="the leaves' provisioning VLAN (deploy and cleaning of bare-metal servers)")

    def plan(self) -> NetworkPlan:
        """The provider's plan these settings describe; raises SettingError for an empty or out-of-bounds pool."""
        vnis = _pool(VniPool, "VNI", self.vni_min, self.vni_max)
        vrfs = _pool(VrfPool, "VRF", self.vrf_min, self.vrf_max)
        pkeys = _pool(PKeyPool, "PKEY", self.pkey_min, self.pkey_max)
        try:
            return NetworkPlan(vnis, self.tenant_cidr, vrfs, pkeys, self.nat_cidr,
                               LeafMap(dict(self.leaf_map), self.leaf_count), self.default_pool,
                               provisioning_vlan=self.provisioning_vlan)
        except ValueError as exc:
            raise SettingError(f"{P}DEFAULT_POOL/{P}TENANT_CIDR: {exc}") from None


def _pool(kind: type[IdPool], prefix: str, first: int, last: int) -> IdPool:
    try:
        return kind(first, last)
    except ValueError as exc:
        raise SettingError(f"{P}{prefix}_MIN/{P}{prefix}_MAX: {exc}") from None


def load_settings(environ: Mapping[str, str] | None = None) -> NetworkSettings:
    """Network's settings from ``environ`` (default: os.environ), the plan checked; raises SettingError."""
    settings = load(NetworkSettings, environ)
    settings.plan()
    return settings


def plan_from_env(environ: Mapping[str, str] | None = None) -> NetworkPlan:
    """The provider's plan from the environment; raises SettingError naming the bad variable."""
    return load_settings(environ).plan()
