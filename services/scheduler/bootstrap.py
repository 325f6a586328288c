"""The only place scheduler's adapters are built and wired. Its own settings: settings.py."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings

from .adapters.leader import LeaderLease
from .entrypoints import bus
from .entrypoints.loops import Leadership, preemption_loop, quota_use_loop, stats_loop, tick_loop
from .handlers import ActiveScheduler
from .settings import SchedulerSettings


def build(settings: ServiceSettings | None = None, scheduler: SchedulerSettings | None = None) -> Runtime:
    """Build the scheduler; its own settings come from TESSERA_SCHEDULER_* unless given (raises ValueError
    naming a bad variable)."""
    settings = settings or ServiceSettings.from_env("scheduler")
    scheduler = scheduler or SchedulerSettings.from_env()
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    active = ActiveScheduler(scheduler)
    bus.wire(rt, active)            # leader-only subscribers: Leadership starts and stops them
    lease = LeaderLease(settings.db_dsn) if scheduler.leader_election else None
    leadership = Leadership(rt, active, lease)
    rt.background(leadership.run)
    rt.background(partial(preemption_loop, rt, leadership, min(1.0, max(scheduler.preemption_grace_s / 4, 0.05))))
    rt.background(partial(stats_loop, rt, active, leadership, scheduler.stats_s))
    rt.background(partial(quota_use_loop, rt, leadership, 1.0))
    rt.background(partial(tick_loop, rt, active, leadership, min(max(scheduler.aging_s / 4, 0.5), 5.0)))
    if lease is not None:
        rt.on_stop.append(lease.release)
    rt.scheduler = active          # tests and the benchmark reach the index through the runtime
    rt.leadership = leadership
    return rt
