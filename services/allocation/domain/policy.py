"""How often an interrupted allocation is rescheduled before it is given up (pure, no I/O).

A node that dies or a GPU that faults may take the next node with it too (a bad image, a job that trips the
driver): rescheduling without bound would bill the tenant for an allocation that never settles. A drain or a
maintenance window is the provider's own doing and says nothing about the allocation, so it is bounded far
more loosely. The bound is on the allocation's reschedules of every kind, compared with the bound of the
interruption that arrives.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

Category = Literal["node_lost", "gpu_fault", "drain", "maintenance"]

RESCHEDULE_LIMITS: Mapping[str, int] = {"node_lost": 3, "gpu_fault": 3, "drain": 10, "maintenance": 10}


def may_reschedule(category: str, reschedules: int, limits: Mapping[str, int] = RESCHEDULE_LIMITS) -> bool:
    """True while an allocation rescheduled ``reschedules`` times already may be rescheduled once more after an
    interruption of ``category``. A category without a bound is never rescheduled (fail rather than loop)."""
    return reschedules < limits.get(category, 0)


def limit_reason(category: str, reschedules: int, limits: Mapping[str, int] = RESCHEDULE_LIMITS) -> str:
    """Why the allocation is given up instead: the category and the count, for the tenant."""
    return (f"{category}: the allocation was rescheduled {reschedules} time(s) already, "
            f"the most allowed after a {category} is {limits.get(category, 0)}")
