"""The only place network's adapters are built and wired.

Service settings (read here, once):
  TESSERA_NETWORK_VNI_MIN / TESSERA_NETWORK_VNI_MAX   VNI pool for tenant networks (default 10000–16777215)
  TESSERA_NETWORK_TENANT_CIDR                         subnet of every tenant network (default 10.0.0.0/24)
"""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from shared.config import ServiceSettings
from shared.runtime import Runtime

from .domain.model import NetworkPlan, VniPool
from .entrypoints import bus


def plan_from_env() -> NetworkPlan:
    """The addressing plan from the environment; raises ValueError naming the bad variable."""
    names = ("TESSERA_NETWORK_VNI_MIN", "TESSERA_NETWORK_VNI_MAX", "TESSERA_NETWORK_TENANT_CIDR")
    first, last, cidr = (os.environ.get(n) or None for n in names)
    try:
        pool = VniPool(int(first or VniPool.first), int(last or VniPool.last))
    except ValueError as exc:
        raise ValueError(f"{names[0]}/{names[1]}: {exc}") from None
    try:
        subnet = ipaddress.IPv4Network(cidr or str(NetworkPlan.tenant_cidr))
    except ValueError as exc:
        raise ValueError(f"{names[2]}: {exc}") from None
    return NetworkPlan(pool, subnet)


def build(settings: ServiceSettings | None = None, plan: NetworkPlan | None = None) -> Runtime:
    settings = settings or ServiceSettings.from_env("network")
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, plan or plan_from_env())
    return rt
