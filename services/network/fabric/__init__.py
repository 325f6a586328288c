"""Fabric drivers, selected by name (TESSERA_NETWORK_FABRIC, a comma-separated list; default: all).

A new driver is one module implementing ``base.FabricDriver`` and one entry in DRIVERS.
"""
from __future__ import annotations

from collections.abc import Callable

from .base import FabricCall, FabricChange, FabricDriver
from .evpn import EvpnNvueDriver
from .infiniband import UfmPartitionDriver

DRIVERS: dict[str, Callable[..., FabricDriver]] = {"evpn": EvpnNvueDriver, "infiniband": UfmPartitionDriver}
DEFAULT = "evpn,infiniband"


def select(spec: str | None, *, ufm_url: str | None = None) -> list[FabricDriver]:
    """The drivers ``spec`` names ("none": no fabric); raises ValueError naming an unknown driver."""
    names = [n.strip() for n in (spec or DEFAULT).split(",") if n.strip()]
    if names == ["none"]:
        return []
    unknown = [n for n in names if n not in DRIVERS]
    if unknown or not names:
        raise ValueError(f"unknown fabric driver(s) {unknown or names}; choose from {sorted(DRIVERS)} or 'none'")
    return [UfmPartitionDriver(ufm_url) if n == "infiniband" and ufm_url else DRIVERS[n]() for n in dict.fromkeys(names)]


__all__ = ["DRIVERS", "FabricCall", "FabricChange", "FabricDriver", "select"]
