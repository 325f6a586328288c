"""Node health: what a node's heartbeats and alerts mean, and what the scheduler does about them (pure, no I/O).

A node-agent sends a heartbeat every few seconds with the node's alerts (each names its source, target, condition
and since when) and the allocations it holds. From them:

- **liveness**: a node whose heartbeats stop is ``suspect`` after one timeout and ``unreachable`` after a second;
  one that answers again is ``reconciling`` until it holds nothing the scheduler placed elsewhere (what it still
  runs for a moved allocation is fenced first), then ``healthy``. A node that never sent a heartbeat is
  ``unknown`` and never judged (an agent that is not started yet is not a failure).
- **classification**: the provider's policy maps each condition to classifications (``CLASSIFICATIONS``); the
  default follows NVIDIA's XID catalog and DCGM's health watches (``DEFAULT_POLICY``).
- **action**: ``prevent_allocations`` cordons the node; ``drain`` cordons it and interrupts every allocation on
  it (each is rescheduled elsewhere); ``fence``, ``reset_gpu`` and ``replace`` are shown to the provider (the
  fence itself is the reschedule's: the old port leaves the network, a returning node destroys what moved).
- **blast radius**: automatic cordons of one pool stop once ``share`` of its nodes were cordoned within
  ``window_s`` (``Breaker``); only a provider admin closes the breaker again.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

UNKNOWN, HEALTHY, SUSPECT, UNREACHABLE, RECONCILING = "unknown", "healthy", "suspect", "unreachable", "reconciling"
STATES = (UNKNOWN, HEALTHY, SUSPECT, UNREACHABLE, RECONCILING)

PREVENT, DRAIN, FENCE, RESET_GPU, REPLACE = "prevent_allocations", "drain", "fence", "reset_gpu", "replace"
CLASSIFICATIONS = (PREVENT, DRAIN, FENCE, RESET_GPU, REPLACE)
CORDONING = frozenset({PREVENT, DRAIN})

CONDITION = re.compile(r"^[a-z_]+(:[0-9]+)?$")
HEARTBEAT_LOST = "heartbeat_lost"

# condition -> (classifications, why). XIDs after NVIDIA's catalog ("resolution bucket") and DCGM's
# BuildXidMappings; where this table is stricter than the catalog it says why.
DEFAULT_POLICY: dict[str, tuple[tuple[str, ...], str]] = {
    # application errors: the GPU stays healthy (as NVIDIA's k8s device plugin treats them)
    **{f"xid:{n}": ((), "application error: the GPU stays in service") for n in (13, 31, 43, 45, 68)},
    "xid:63": ((), "row remap or page retirement recorded (catalog: no action; the remap happens at the next reset, "
                   "which the pending-remap condition tracks)"),
    "xid:94": ((), "contained ECC error (catalog: restart the application); the GPU stays in service"),
    "xid:48": ((DRAIN, RESET_GPU), "double-bit ECC error: reset the GPU"),
    "xid:74": ((DRAIN, RESET_GPU), "NVLink error: reset the GPU"),
    "xid:95": ((DRAIN, RESET_GPU), "uncontained ECC error: reset the GPU"),
    "xid:119": ((DRAIN, RESET_GPU), "GSP timeout: reset the GPU"),
    "xid:120": ((DRAIN, RESET_GPU), "GSP error: reset the GPU"),
    "xid:64": ((DRAIN, REPLACE), "row remap failure: the GPU needs replacing"),
    "xid:79": ((DRAIN, FENCE, REPLACE), "GPU fell off the bus: reboot the node, replace the GPU if it recurs"),
    "xid:140": ((DRAIN, REPLACE), "unrecovered ECC error: the GPU needs replacing"),
    # an XID the table does not name: stricter than the catalog (which has no bucket for unknown codes) —
    # no new work lands on the node until a provider admin has looked
    "xid:default": ((PREVENT,), "an XID this policy does not name: no new placements until a provider admin looks"),
    "ecc_dbe": ((DRAIN, RESET_GPU), "uncorrectable (double-bit) ECC errors"),
    "retired_pages_pending": ((PREVENT, RESET_GPU), "retired pages pending: reset the GPU when it is free"),
    "remapped_rows_pending": ((PREVENT, RESET_GPU), "remapped rows pending: reset the GPU when it is free"),
    "temperature": ((PREVENT,), "GPU temperature over its limit"),
    "power": ((PREVENT,), "GPU power over its limit"),
    "nvlink": ((DRAIN, RESET_GPU), "NVLink errors"),
    HEARTBEAT_LOST: ((DRAIN, FENCE), "the node-agent stopped answering"),
    "burn_in_failed": ((PREVENT, REPLACE), "the node failed its burn-in"),
    "agent_slow": ((), "the node-agent answers late"),
}

# the category of the interruption a condition causes (the allocation's retry policy counts by it)
def category(condition: str) -> str:
    return "node_lost" if condition == HEARTBEAT_LOST else "gpu_fault"


def classify(condition: str, policy: Mapping[str, Iterable[str]]) -> tuple[str, ...]:
    """The classifications of ``condition`` under ``policy`` (condition -> classifications): an XID the policy
    does not name takes ``xid:default``; any other unknown condition takes none."""
    if condition in policy:
        return tuple(policy[condition])
    if condition.startswith("xid:"):
        return tuple(policy.get("xid:default", ()))
    return ()


@dataclass(frozen=True)
class Alert:
    source: str
    target: str
    condition: str
    since: datetime
    message: str
    tenant_message: str
    classifications: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, datetime]:
        """What makes an alert the same alert from one heartbeat to the next."""
        return (self.target, self.condition, self.since)


def lost_heartbeat(since: datetime) -> Alert:
    return Alert("monitor", "node", HEARTBEAT_LOST, since, "no heartbeat from the node-agent since "
                 f"{since.isoformat()}", "the server running this allocation stopped answering")


def liveness(last_seen: datetime, now: datetime, timeout_s: float) -> str:
    """healthy, suspect (one timeout without a heartbeat) or unreachable (two)."""
    silent = (now - last_seen).total_seconds()
    if silent >= 2 * timeout_s:
        return UNREACHABLE
    if silent >= timeout_s:
        return SUSPECT
    return HEALTHY


def next_state(current: str, live: str, stray: bool) -> str:
    """The node's state from its liveness and whether it holds instances placed elsewhere (``stray``): an
    unreachable node stays unreachable until it answers; a node that answers is healthy only once it holds no
    stray instance (``reconciling`` until then)."""
    if live != HEALTHY:
        return UNREACHABLE if current == UNREACHABLE else live
    return RECONCILING if stray else HEALTHY


def actions(alerts: Iterable[Alert]) -> frozenset[str]:
    return frozenset(c for a in alerts for c in a.classifications)


@dataclass
class Breaker:
    """Automatic cordons of one pool within a window; open once ``share`` of the pool was cordoned in it."""

    pool: str
    share: float = 0.5
    window_s: float = 300.0
    cordons: list[datetime] = field(default_factory=list)
    open: bool = False
    opened_at: datetime | None = None

    def recent(self, now: datetime) -> list[datetime]:
        edge = now - timedelta(seconds=self.window_s)
        return [t for t in self.cordons if t > edge]

    def allows(self, now: datetime, pool_size: int) -> bool:
        """Whether one more automatic cordon may happen now; opens the breaker (and says no) when the pool's
        recent cordons reached ``share`` of its ``pool_size`` nodes. An open breaker stays open."""
        if self.open:
            return False
        if len(self.recent(now)) + 1 > max(1, math.floor(self.share * pool_size)) and pool_size > 1:
            self.open, self.opened_at = True, now
            return False
        return True

    def record(self, now: datetime) -> None:
        self.cordons = [*self.recent(now), now]

    def close(self) -> None:
        self.open, self.opened_at, self.cordons = False, None, []
