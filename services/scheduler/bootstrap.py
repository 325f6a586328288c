"""The only place scheduler's adapters are built and wired.

Settings (besides the kit's): TESSERA_SCHEDULER_QUEUE_PER_TENANT (pending requests one tenant may have,
default 100), TESSERA_SCHEDULER_AGING_S (wait after which a request reserves a node, default 300),
TESSERA_SCHEDULER_PREEMPTION_GRACE_S (notice → allocation.preempt, default 30), TESSERA_SCHEDULER_STATS_S
(scheduling_stats period, default 15), TESSERA_SCHEDULER_LEADER_ELECTION (1: one active replica, the
default; 0: every replica decides, guarded by SQL alone). A bad value is refused naming the variable.
"""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from shared.settings import ServiceSettings
from shared.runtime import Runtime

from .adapters.leader import LeaderLease
from .entrypoints import bus
from .entrypoints.loops import Leadership, preemption_loop, quota_use_loop, stats_loop, tick_loop
from .handlers import ActiveScheduler, SchedulerSettings


def _number(name: str, default: str, cast, *, minimum: float) -> float:
    raw = os.environ.get(name) or default
    try:
        value = cast(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r} must be at least {minimum}")
    return value


def scheduler_settings() -> SchedulerSettings:
    """Read the scheduler's own settings; raises ValueError naming a bad variable."""
    election = os.environ.get("TESSERA_SCHEDULER_LEADER_ELECTION") or "1"
    if election not in ("0", "1"):
        raise ValueError(f"TESSERA_SCHEDULER_LEADER_ELECTION={election!r} must be 0 or 1")
    return SchedulerSettings(
        queue_per_tenant=_number("TESSERA_SCHEDULER_QUEUE_PER_TENANT", "100", int, minimum=1),
        aging_s=_number("TESSERA_SCHEDULER_AGING_S", "300", float, minimum=0),
        preemption_grace_s=_number("TESSERA_SCHEDULER_PREEMPTION_GRACE_S", "30", float, minimum=0),
        stats_s=_number("TESSERA_SCHEDULER_STATS_S", "15", float, minimum=0.1),
        leader_election=election == "1")


def build(settings: ServiceSettings | None = None, scheduler: SchedulerSettings | None = None) -> Runtime:
    settings = settings or ServiceSettings.from_env("scheduler")
    scheduler = scheduler or scheduler_settings()
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    active = ActiveScheduler(scheduler)
    subscribers = bus.wire(rt, active)
    lease = LeaderLease(settings.db_dsn) if scheduler.leader_election else None
    if lease is not None:
        # Subscribers start only once elected: take them out of the broker's start-up set.
        # (FastStream keeps them referenced through its persistent list; the weak set is what it starts.)
        for sub in subscribers:
            rt.broker._subscribers.discard(sub)
    leadership = Leadership(rt, active, subscribers if lease is not None else [], lease)
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
