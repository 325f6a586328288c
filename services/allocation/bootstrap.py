"""The only place allocation's adapters are built and wired."""
from __future__ import annotations

from pathlib import Path

from shared.settings import ServiceSettings
from shared.runtime import Runtime

from .entrypoints import bus


def build(settings: ServiceSettings | None = None) -> Runtime:
    settings = settings or ServiceSettings.from_env("allocation")
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt)
    return rt
