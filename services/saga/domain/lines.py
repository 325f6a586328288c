"""Each tenant's line (pure; no I/O): at most ``Policy.tenant_inflight`` allocate sagas of one tenant are in
flight (running or compensating); the tenant's further requests wait, first come first served, and start as
its sagas end. One tenant's burst waits in its own line: it never takes another tenant's place.

Why here and not in the scheduler's queue: the scheduler queues what does not fit the capacity; this line
bounds the control-plane work (messages, transactions) a single tenant can have in flight, so a tenant that
floods the API cannot fill every participant's stream ahead of another tenant's allocations.
"""
from __future__ import annotations

from dataclasses import dataclass

from .model import OPEN, Saga

IN_FLIGHT = OPEN      # saga statuses that hold a place in the tenant's line


@dataclass(frozen=True)
class Line:
    """A tenant's line as read under its lock: its allocate sagas in flight, and whether requests wait."""

    in_flight: int
    waiting: bool


def admits(line: Line, bound: int) -> bool:
    """Whether a new request starts at once: the tenant is under its bound and no earlier request waits
    (a request never overtakes one of its own tenant's that waits)."""
    return not line.waiting and line.in_flight < bound


def room(in_flight: int, bound: int) -> int:
    """How many waiting requests may start now (none when the tenant is at or over its bound, e.g. after
    the bound was lowered: the excess drains as its sagas end)."""
    return max(0, bound - in_flight)


def leaves_flight(before: Saga, after: Saga) -> bool:
    """An allocate saga that just ended (completed, or failed once compensated): its place goes to the
    oldest request waiting in its tenant's line."""
    return before.kind == "allocate" and before.status in IN_FLIGHT and after.status not in IN_FLIGHT
