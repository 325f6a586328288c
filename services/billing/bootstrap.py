"""The only place billing's adapters are built and wired.

Billing reads the kit's ``ServiceSettings`` (``TESSERA_SIM_FAULTS`` among them) and its own
``BillingSettings`` (services/billing/settings.py: checkpoints, meter cuts, invoices, webhooks). Its adapters
(the asyncpg repositories and ``PgLedger``) live as long as a unit of work: the handlers build them on each unit
of work's connection.
"""
from __future__ import annotations

from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings, load

from .entrypoints import bus, loops
from .settings import BillingSettings


def build(settings: ServiceSettings | None = None, config: BillingSettings | None = None, **overrides) -> Runtime:
    """``overrides``: BillingSettings fields to set over the environment (tests: ``checkpoint_s=0``)."""
    settings = settings or ServiceSettings.from_env("billing")
    config = load(BillingSettings, **overrides) if config is None else config
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, config)
    loops.wire(rt, config)
    return rt
