"""Fabric drivers, selected by name (TESSERA_NETWORK_FABRIC, a comma-separated list; see settings).

Adapters: each driver renders its calls purely and ``send``s them (the recording drivers here write them
to ``fabric_calls`` in the caller's transaction). A new driver is one module implementing
``base.FabricDriver`` and one entry in DRIVERS.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from .base import FabricCall, FabricChange, FabricDriver, FabricRefused, PortChange
from .evpn import EvpnNvueDriver
from .infiniband import UfmPartitionDriver
from .leaf import LeafDriver

DRIVERS: dict[str, Callable[..., FabricDriver]] = {"evpn": EvpnNvueDriver, "infiniband": UfmPartitionDriver,
                                                   "leaf": LeafDriver}


def select(names: Iterable[str], *, ufm_url: str | None = None, leaf_netns: dict[str, str] | None = None,
           provisioning_vlan: int = 4094) -> list[FabricDriver]:
    """The drivers ``names`` names, in order, each once (none: no fabric); raises ValueError naming an unknown one.
    ``ufm_url``: the base URL of the UFM the InfiniBand driver addresses (None: its default); ``leaf_netns``: the
    Linux leaves the kernel driver programs (leaf → namespace); ``provisioning_vlan``: where a server port goes
    back to."""
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in DRIVERS]
    if unknown:
        raise ValueError(f"unknown fabric driver(s) {unknown}; choose from {sorted(DRIVERS)} or 'none'")
    made = {"evpn": lambda: EvpnNvueDriver(provisioning_vlan=provisioning_vlan),
            "infiniband": lambda: UfmPartitionDriver(ufm_url) if ufm_url else UfmPartitionDriver(),
            "leaf": lambda: LeafDriver(leaf_netns, provisioning_vlan)}
    return [made[n]() for n in names]


__all__ = ["DRIVERS", "FabricCall", "FabricChange", "FabricDriver", "FabricRefused", "PortChange", "select"]
