"""The gateway's pure rules: who may do what, and how the allocation read model moves (no I/O)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

Role = Literal["provider_admin", "tenant_admin", "tenant_user"]
State = Literal["REQUESTED", "QUEUED", "PROVISIONING", "ACTIVE", "INTERRUPTED", "RELEASING", "RELEASED", "FAILED"]

# Forward order of the allocation lifecycle; FAILED ranks above everything so it always wins.
# An allocation is PROVISIONING once the scheduler reserved its slots ("placed"), after QUEUED. A view moved to
# PROVISIONING before its placement (older versions told the saga's start) ranks before QUEUED.
# ACTIVE and INTERRUPTED share a rank: an allocation goes back and forth between them (its node failed, it was
# rescheduled), which the rank cannot order; the reschedule's attempt number does (``interruption_moves``).
_RANK: dict[str, int] = {"REQUESTED": 0, "PROVISIONING": 1, "QUEUED": 2, "ACTIVE": 4, "INTERRUPTED": 4,
                         "RELEASING": 5, "RELEASED": 6, "FAILED": 7}
_PLACED = 3
TERMINAL = frozenset({"RELEASED", "FAILED"})
# A DELETE of an allocation in one of these states was already accepted: answer 202 again, send nothing.
RELEASE_ALREADY_REQUESTED = frozenset({"RELEASING", "RELEASED"})


def advances(current: str, new: str) -> bool:
    """True when moving the read model from ``current`` to ``new`` is forward.

    Events arrive on separate consumers, so their order is not guaranteed: a late
    ``slots_reserved`` must not drag an ACTIVE allocation back. Terminal states never change.
    Raises KeyError for a state outside the lifecycle.
    """
    if current in TERMINAL:
        return False
    return _RANK[new] > _RANK[current]


def advancing_from(new: str) -> list[str]:
    """The states from which moving to ``new`` is forward (``advances``): a move's guard, checked by the write."""
    return [current for current in _RANK if advances(current, new)]


def stage(state: str, placed: bool = False) -> int:
    """Rank of a view state; ``placed``: the scheduler reserved the slots (PROVISIONING after QUEUED)."""
    return _PLACED if placed and state == "PROVISIONING" else _RANK[state]


def advances_to(current: str, current_placed: bool, new: str, new_placed: bool = False) -> bool:
    """Like ``advances``, telling PROVISIONING before and after the slots were reserved apart:
    QUEUED → PROVISIONING (placed) is forward, a late QUEUED after the slots were reserved is not."""
    if current in TERMINAL:
        return False
    return stage(new, new_placed) > stage(current, current_placed)


def interruption_moves(current: str, shown_attempt: int, shown_rescheduled: bool, attempt: int,
                       rescheduled: bool) -> bool:
    """True when an interruption event moves the view's state: ``allocation.interrupted`` (``rescheduled`` False)
    to INTERRUPTED, ``allocation.rescheduled`` (True) to ACTIVE, for reschedule ``attempt``; the view shows the
    interruption of ``shown_attempt`` (0: none) and whether it was rescheduled.

    Attempts only grow, and each is interrupted before it is rescheduled, so a later attempt moves the view and
    an earlier one never does; within one attempt, only a rescheduled not seen yet moves it (an interruption
    arriving after its own reschedule is late). Never from RELEASING or a terminal state, nor back from them."""
    if current in TERMINAL or _RANK[current] > _RANK["ACTIVE"] or attempt < shown_attempt:
        return False
    if attempt > shown_attempt:
        return True
    return not shown_rescheduled


@dataclass(frozen=True)
class Principal:
    """The caller, as the bearer token says (verified signature, not expired)."""

    user_id: uuid.UUID
    tenant_id: uuid.UUID | None
    role: Role
    # the fingerprint of the API key the token was issued for (domain.audit.api_key_id); None: unknown
    api_key_id: str | None = None

    @property
    def is_provider_admin(self) -> bool:
        return self.role == "provider_admin"

    def may_manage_users_of(self, tenant_id: uuid.UUID) -> bool:
        """Provider admins manage every tenant's users; a tenant admin only its own tenant's."""
        return self.is_provider_admin or (self.role == "tenant_admin" and self.tenant_id == tenant_id)

    @property
    def may_use_allocations(self) -> bool:
        """Allocations belong to a tenant: only tenant members (admins and users) work with them."""
        return self.tenant_id is not None and self.role in ("tenant_admin", "tenant_user")


def allocation_links(allocation_id: uuid.UUID) -> dict[str, str]:
    base = f"/v1/allocations/{allocation_id}"
    return {"self": base, "events": f"{base}/events"}
