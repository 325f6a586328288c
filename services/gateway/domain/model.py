"""The gateway's pure rules: who may do what, and how the allocation read model moves (no I/O)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

Role = Literal["provider_admin", "tenant_admin", "tenant_user"]
State = Literal["REQUESTED", "PROVISIONING", "ACTIVE", "RELEASING", "RELEASED", "FAILED"]

# Forward order of the allocation lifecycle; FAILED ranks above everything so it always wins.
_RANK: dict[str, int] = {"REQUESTED": 0, "PROVISIONING": 1, "ACTIVE": 2, "RELEASING": 3, "RELEASED": 4, "FAILED": 5}
TERMINAL = frozenset({"RELEASED", "FAILED"})
# A DELETE of an allocation in one of these states was already accepted: answer 202 again, send nothing.
RELEASE_ALREADY_REQUESTED = frozenset({"RELEASING", "RELEASED"})


def advances(current: str, new: str) -> bool:
    """True when moving the read model from ``current`` to ``new`` is forward.

    Events arrive on separate consumers, so their order is not guaranteed: a late
    ``provisioning`` must not drag an ACTIVE allocation back. Terminal states never change.
    Raises KeyError for a state outside the lifecycle.
    """
    if current in TERMINAL:
        return False
    return _RANK[new] > _RANK[current]


@dataclass(frozen=True)
class Principal:
    """The caller, as the bearer token says (verified signature, not expired)."""

    user_id: uuid.UUID
    tenant_id: uuid.UUID | None
    role: Role

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
