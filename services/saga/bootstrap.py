"""The only place the saga coordinator's adapters are built and wired."""
from __future__ import annotations

from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings

from .entrypoints import bus, loops
from .settings import SagaSettings


def build(settings: ServiceSettings | None = None, saga: SagaSettings | None = None) -> Runtime:
    """Build the coordinator; its own settings come from TESSERA_SAGA_* unless given (raises ValueError if bad)."""
    settings = settings or ServiceSettings.from_env("saga")
    saga = saga or SagaSettings.from_env()
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, saga.policy)
    loops.wire(rt, saga.policy, saga.deadline_poll_s)
    return rt
