"""The only place the gateway's adapters are built and wired: the runtime (bus, database, HTTP server), the
projections' subscribers, the HTTP API and the periodic work. Settings are read here, once."""
from __future__ import annotations

from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings, load

from .entrypoints import bus, loops
from .entrypoints.http import create_app
from .settings import GatewaySettings


def build(settings: ServiceSettings | None = None, config: GatewaySettings | None = None) -> Runtime:
    settings = settings or ServiceSettings.from_env("gateway")
    config = load(GatewaySettings) if config is None else config
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt)
    create_app(rt, config)
    loops.wire(rt, config)
    return rt
