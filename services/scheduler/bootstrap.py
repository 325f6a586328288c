"""The only place scheduler's adapters are built and wired. Its own settings: settings.py."""
from __future__ import annotations

from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings

from .entrypoints import bus, loops
from .handlers import ActiveScheduler
from .handlers.health import HealthMonitor
from .settings import SchedulerSettings


def build(settings: ServiceSettings | None = None, scheduler: SchedulerSettings | None = None) -> Runtime:
    """Build the scheduler; its own settings come from TESSERA_SCHEDULER_* unless given (raises ValueError
    naming a bad variable)."""
    settings = settings or ServiceSettings.from_env("scheduler")
    scheduler = scheduler or SchedulerSettings.from_env()
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    active = ActiveScheduler(scheduler)
    monitor = HealthMonitor(scheduler)
    bus.wire(rt, active)            # leader-only subscribers: the leadership starts and stops them
    leadership = loops.wire(rt, active, scheduler, monitor)
    rt.health_monitor = monitor     # tests reach the heartbeats received through the runtime
    rt.scheduler = active          # tests and the benchmark reach the index through the runtime
    rt.leadership = leadership
    return rt
