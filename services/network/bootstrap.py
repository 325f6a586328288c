"""The only place network's adapters are built and wired.

Service settings (read here, once; a bad value is refused naming its variable):
  TESSERA_NETWORK_VNI_MIN / _VNI_MAX     VNI pool: network VNIs and tenants' L3 VNIs (default 10000–16777215)
  TESSERA_NETWORK_VRF_MIN / _VRF_MAX     route-table / VRF id pool, one per tenant (default 1000–64999)
  TESSERA_NETWORK_PKEY_MIN / _PKEY_MAX   InfiniBand PKey pool, one per tenant (default 0x0001–0x7FFE; hex or decimal)
  TESSERA_NETWORK_NAT_CIDR               NAT gateway addresses, one per tenant network (default 198.51.100.0/24)
  TESSERA_NETWORK_TENANT_CIDR            subnet of a tenant's implicit "default" network (default 10.0.0.0/24)
  TESSERA_NETWORK_LEAF_MAP               "<node uuid>=<leaf>,..." nodes → leaf switch (others: a deterministic leaf)
  TESSERA_NETWORK_LEAF_COUNT             leaves the deterministic mapping spreads nodes over (default 4)
  TESSERA_NETWORK_FABRIC                 fabric drivers, comma-separated: evpn, infiniband, or none (default both)
  TESSERA_NETWORK_UFM_URL                base URL of the UFM the InfiniBand driver addresses
"""
from __future__ import annotations

import ipaddress
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from shared.settings import ServiceSettings
from shared.runtime import Runtime

from . import fabric as fabrics
from .domain.model import IdPool, LeafMap, NetworkPlan, PKeyPool, VniPool, VrfPool
from .entrypoints import bus

P = "TESSERA_NETWORK_"


def _read(env: Mapping[str, str], name: str, parse: Callable, default):
    raw = env.get(P + name) or None
    if raw is None:
        return default
    try:
        return parse(raw.strip())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{P}{name}: {exc}") from None


def _pool(env: Mapping[str, str], kind: type[IdPool], prefix: str) -> IdPool:
    first = _read(env, f"{prefix}_MIN", lambda s: int(s, 0), kind.first)
    last = _read(env, f"{prefix}_MAX", lambda s: int(s, 0), kind.last)
    try:
        return kind(first, last)
    except ValueError as exc:
        raise ValueError(f"{P}{prefix}_MIN/{P}{prefix}_MAX: {exc}") from None


def _leaf_map(text: str) -> dict[uuid.UUID, str]:
    out = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        node, sep, leaf = item.partition("=")
        if not sep or not leaf.strip():
            raise ValueError(f"{item!r} is not '<node uuid>=<leaf>'")
        out[uuid.UUID(node.strip())] = leaf.strip()
    return out


def _leaf_count(text: str) -> int:
    count = int(text)
    LeafMap(count=count)   # raises ValueError when out of range
    return count


def _subnet(text: str) -> ipaddress.IPv4Network:
    net = ipaddress.IPv4Network(text)
    if net.prefixlen > 30:
        raise ValueError(f"{net} is too small: it needs at least two host addresses")
    return net


def plan_from_env(env: Mapping[str, str] | None = None) -> NetworkPlan:
    """The provider's plan from the environment; raises ValueError naming the bad variable."""
    env = os.environ if env is None else env
    leaves = LeafMap(_read(env, "LEAF_MAP", _leaf_map, {}), _read(env, "LEAF_COUNT", _leaf_count, 4))
    tenant_cidr = _read(env, "TENANT_CIDR", _subnet, NetworkPlan.tenant_cidr)
    nat_cidr = _read(env, "NAT_CIDR", _subnet, NetworkPlan.nat_cidr)
    return NetworkPlan(_pool(env, VniPool, "VNI"), tenant_cidr, _pool(env, VrfPool, "VRF"),
                       _pool(env, PKeyPool, "PKEY"), nat_cidr, leaves)


def fabric_from_env(env: Mapping[str, str] | None = None) -> list[fabrics.FabricDriver]:
    env = os.environ if env is None else env
    try:
        return fabrics.select(env.get(P + "FABRIC"), ufm_url=env.get(P + "UFM_URL") or None)
    except ValueError as exc:
        raise ValueError(f"{P}FABRIC: {exc}") from None


def build(settings: ServiceSettings | None = None, plan: NetworkPlan | None = None,
          fabric: list[fabrics.FabricDriver] | None = None) -> Runtime:
    settings = settings or ServiceSettings.from_env("network")
    plan = plan or plan_from_env()
    fabric = fabric_from_env() if fabric is None else fabric
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, plan, fabric)
    return rt
