"""The only place storage's adapters are built and wired.

Its own settings are ``settings.StorageSettings`` (TESSERA_STORAGE_DEFAULT_QUOTA_GB), read here, once. Its one
adapter, the asyncpg ``PgVolumeRepository``, lives as long as a unit of work: the handlers build it on each unit
of work's connection (their ``repository`` factory).
"""
from __future__ import annotations

import os
from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings, load

from .entrypoints import bus
from .settings import StorageSettings


def build(settings: ServiceSettings | None = None, storage: StorageSettings | None = None) -> Runtime:
    """Build the storage service; its own settings come from the environment unless given (a bad value raises
    SettingError, a ValueError naming the variable)."""
    settings = settings or ServiceSettings.from_env("storage")
    storage = storage or load(StorageSettings, os.environ)
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, storage.policy)
    return rt
