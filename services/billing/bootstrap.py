"""The only place billing's adapters are built and wired.

Billing reads the kit's ``ServiceSettings`` (``TESSERA_SIM_FAULTS`` among them) and one setting of its own:
  TESSERA_BILLING_CHECKPOINT_S   [300] seconds between Merkle checkpoints of the ledger (0: none)
Its adapters (the asyncpg repositories and ``PgLedger``) live as long as a unit of work: the handlers build
them on each unit of work's connection.
"""
from __future__ import annotations

import os
from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings, SettingError

from .entrypoints import bus

CHECKPOINT_ENV = "TESSERA_BILLING_CHECKPOINT_S"


def checkpoint_every_s(environ=None) -> float:
    raw = (os.environ if environ is None else environ).get(CHECKPOINT_ENV, "300")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise SettingError(f"{CHECKPOINT_ENV} must be a number of seconds >= 0, got {raw!r}")
    return value


def build(settings: ServiceSettings | None = None, *, checkpoint_s: float | None = None) -> Runtime:
    settings = settings or ServiceSettings.from_env("billing")
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, checkpoint_every_s=checkpoint_every_s() if checkpoint_s is None else checkpoint_s)
    return rt
