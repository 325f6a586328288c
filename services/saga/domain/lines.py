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


# --- places: what a waiting request is told of its place in line -------------------------------------------

PLACES_TOLD = 50   # within these places, every change of place is told; further back, only each halving


def retell(place: int, told: int | None) -> bool:
    """Whether a request now at ``place`` (1 = next to start) is told it, having last been told ``told`` (None:
    never). Places only go down while it waits (a request never overtakes an earlier one), so the told place
    is never below the real one.

    What bounds the messages: each change of place within the first ``PLACES_TOLD`` places, and further back
    only a place at most half the one told, so a request is told at most ``PLACES_TOLD + log2(place it joined
    at)`` times, and a line of n costs O(n·PLACES_TOLD) messages to drain, not O(n²). Further back than
    ``PLACES_TOLD`` the place shown is at most twice the real one."""
    if told is None:
        return True
    return place < told and (place <= PLACES_TOLD or 2 * place <= told)


def places(waiting: list[tuple[object, int | None]]) -> list[tuple[object, int]]:
    """(request, its place) for each request of a tenant's line, given in line order as (request, place last
    told), that is to be told its place now (``retell``)."""
    return [(key, place) for place, (key, told) in enumerate(waiting, start=1) if retell(place, told)]


# --- a release before the allocate saga started ------------------------------------------------------------

FROM_LINE, EARLY, AFTER_START, NOW, NOTHING = "from_line", "early", "after_start", "now", "nothing"


def withdrawal(in_line: bool, allocate_status: str | None) -> str:
    """What a tenant's release of an allocation that is not ACTIVE yet does, decided under its tenant's line
    lock (and its allocate saga's row lock, if it has one):

    - ``from_line``: it waits in its tenant's line: it leaves the line and is released at once (nothing was
      reserved, no step ran);
    - ``early``: the coordinator has not had its request yet: it never starts, and is released once the
      request comes;
    - ``after_start``: its allocate saga runs: the release follows once that saga completes (none when it
      fails: the allocation ends FAILED, its steps undone);
    - ``now``: its allocate saga completed (the allocation is ACTIVE): released now;
    - ``nothing``: its allocate saga failed (the allocation is FAILED).
    """
    if in_line:
        return FROM_LINE
    if allocate_status is None:
        return EARLY
    if allocate_status in IN_FLIGHT:
        return AFTER_START
    return NOW if allocate_status == "completed" else NOTHING
