"""Fabric drivers, selected by name (TESSERA_NETWORK_FABRIC, a comma-separated list; see settings).

Adapters: each driver renders its calls purely and ``send``s them (the recording drivers here write them
to ``fabric_calls`` in the caller's transaction). A new driver is one module implementing
``base.FabricDriver`` and one entry in DRIVERS.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from .base import FabricCall, FabricChange, FabricDriver
from .evpn import EvpnNvueDriver
from .infiniband import UfmPartitionDriver

DRIVERS: dict[str, Callable[..., FabricDriver]] = {"evpn": EvpnNvueDriver, "infiniband": UfmPartitionDriver}


def select(names: Iterable[str], *, ufm_url: str | None = None) -> list[FabricDriver]:
    """The drivers ``names`` names, in order, each once (none: no fabric); raises ValueError naming an unknown one.
    ``ufm_url``: the base URL of the UFM the InfiniBand driver addresses (None: its default)."""
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in DRIVERS]
    if unknown:
        raise ValueError(f"unknown fabric driver(s) {unknown}; choose from {sorted(DRIVERS)} or 'none'")
    return [UfmPartitionDriver(ufm_url) if n == "infiniband" and ufm_url else DRIVERS[n]() for n in names]


__all__ = ["DRIVERS", "FabricCall", "FabricChange", "FabricDriver", "select"]
