"""The scheduler's own settings (besides the kit's), read from the environment in bootstrap, never at import.

``SchedulerSettings.from_env()`` refuses a bad value with a ValueError naming the variable;
``shared.settings.describe(SchedulerSettings)`` lists every variable, its default and meaning.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.settings import flag, integer, load, number, setting


@dataclass(frozen=True)
class SchedulerSettings:
    queue_per_tenant: int = setting("TESSERA_SCHEDULER_QUEUE_PER_TENANT", 100, integer(1),
                                    doc="pending requests one tenant may have (bound of its queue)")
    aging_s: float = setting("TESSERA_SCHEDULER_AGING_S", 300.0, number(0),
                             doc="wait after which a large blocked request reserves a node")
    preemption_grace_s: float = setting("TESSERA_SCHEDULER_PREEMPTION_GRACE_S", 30.0, number(0),
                                        doc="preemption notice → `allocation.preempt`")
    stats_s: float = setting("TESSERA_SCHEDULER_STATS_S", 15.0, number(0.1),
                             doc="period of the `scheduler.scheduling_stats` event")
    burn_in: bool = setting("TESSERA_SCHEDULER_BURN_IN", True, flag,
                            doc="`1`: an approved node is burnt in by its node-agent before it is schedulable "
                                "(and a provider admin can re-run it); `0`: approval makes it schedulable at once")
    leader_election: bool = setting("TESSERA_SCHEDULER_LEADER_ELECTION", True, flag,
                                    doc="`1`: one active replica (leader election); `0`: every replica decides, "
                                        "guarded by SQL alone")

    heartbeat_timeout_s: float = setting("TESSERA_SCHEDULER_HEARTBEAT_TIMEOUT_S", 4.0, number(0.1),
                                         doc="a node without a heartbeat for this long is suspect; for twice as "
                                             "long, unreachable (its allocations are rescheduled)")
    health_period_s: float = setting("TESSERA_SCHEDULER_HEALTH_PERIOD_S", 0.5, number(0.05),
                                     doc="how often the leader judges every node's health")
    breaker_share: float = setting("TESSERA_SCHEDULER_BREAKER_SHARE", 0.5, number(0),
                                   doc="automatic cordons of a pool stop once this share of its nodes was cordoned "
                                       "within the window (a provider admin closes the breaker)")
    breaker_window_s: float = setting("TESSERA_SCHEDULER_BREAKER_WINDOW_S", 300.0, number(1),
                                      doc="the breaker's window")
    fence_retry_s: float = setting("TESSERA_SCHEDULER_FENCE_RETRY_S", 10.0, number(0.1),
                                   doc="how often a node still holding instances placed elsewhere is told again to "
                                       "fence them")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SchedulerSettings:
        return load(cls, environ)
