"""The only place storage's adapters are built and wired.

Its own settings are ``settings.StorageSettings`` (the storage classes, the default quotas, the usage interval),
read here, once. One backend is built per storage class (nothing is touched: no command runs, no appliance is
reached, until a volume is made). The asyncpg ``PgVolumeRepository`` lives as long as a unit of work: the
handlers build it on each unit of work's connection (their ``repository`` factory).
"""
from __future__ import annotations

import os
from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings, load

from .entrypoints import bus, loops
from .handlers.lifecycle import Backends
from .settings import StorageSettings


def build(settings: ServiceSettings | None = None, storage: StorageSettings | None = None,
          backends: Backends | None = None) -> Runtime:
    """Build the storage service; its own settings come from the environment unless given (a bad value raises
    SettingError, a ValueError naming the variable), its backends from those settings unless given (by class)."""
    settings = settings or ServiceSettings.from_env("storage")
    storage = storage or load(StorageSettings, os.environ)
    backends = storage.backends() if backends is None else backends
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, storage.policy, backends)
    loops.wire(rt, storage.policy, backends, storage.usage_interval_s)
    return rt
