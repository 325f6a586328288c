"""The only place network's adapters (the fabric drivers) are built and wired; its settings are settings.py's."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings

from .adapters import fabric as fabrics
from .domain.model import NetworkPlan
from .entrypoints import bus
from .settings import load_settings, plan_from_env


def fabric_from_env(environ: Mapping[str, str] | None = None) -> list[fabrics.FabricDriver]:
    """The fabric drivers TESSERA_NETWORK_FABRIC names (connects nothing); raises SettingError."""
    settings = load_settings(environ)
    return fabrics.select(settings.fabric, ufm_url=settings.ufm_url, leaf_netns=settings.leaf_netns,
                          provisioning_vlan=settings.provisioning_vlan)


def build(settings: ServiceSettings | None = None, plan: NetworkPlan | None = None,
          fabric: list[fabrics.FabricDriver] | None = None) -> Runtime:
    """Build (connect nothing) the network service; ``plan`` and ``fabric`` override the environment's."""
    settings = settings or ServiceSettings.from_env("network")
    plan = plan or plan_from_env()
    fabric = fabric_from_env() if fabric is None else fabric
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, plan, fabric)
    return rt
