"""The only place allocation's adapters are built and wired.

Allocation has no settings of its own (so no settings.py): it reads only the kit's ``ServiceSettings``
(``TESSERA_SIM_FAULTS`` among them). Its one adapter, the asyncpg ``PgAllocationRepository``, lives as long
as a unit of work: the handlers build it on each unit of work's connection (their ``repository`` factory).
"""
from __future__ import annotations

from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings

from .entrypoints import bus


def build(settings: ServiceSettings | None = None) -> Runtime:
    settings = settings or ServiceSettings.from_env("allocation")
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt)
    return rt
