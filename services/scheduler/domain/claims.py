"""What a claim is and how it can be refused (pure, no I/O): the repository port's vocabulary for taking slots
and charging quota, all or nothing (see adapters/claims.py for how PostgreSQL makes it so)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass

NIL = uuid.UUID(int=0)   # the user of a tenant's own quota row (a user's share names the user)


class QuotaExceeded(Exception):
    def __init__(self, quota: str, limit: int | None, used: int, requested: int):
        super().__init__(f"no quota {quota}: the tenant may not allocate {requested} GPU(s) there" if limit is None
                         else f"quota {quota} exceeded: limit {limit}, in use {used}, requested {requested}")
        self.quota, self.limit, self.used, self.requested = quota, limit, used, requested


class SlotTaken(Exception):
    """The chosen slots were no longer free (the in-memory index was stale): nothing was claimed."""


class ShapeDeleted(Exception):
    """The request's shape was deleted meanwhile (a deletion committed before the claim): nothing was claimed."""


@dataclass(frozen=True)
class Claim:
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID | None
    node_id: uuid.UUID
    slots: tuple[int, ...]
    shape: str
    gpu_model: str
    pool: str
    units: int                      # GPUs charged against quota
    priority: int = 0
    spot: bool = False
    mig_profile: str | None = None
    mig_per_gpu: int = 0


def quota_name(tenant_id, gpu_model: str, pool: str, user_id=None) -> str:
    """The readable name (the domain's QuotaKey.name, plus the user for a tenant admin's split)."""
    base = f"tenant/{tenant_id}/{gpu_model}/{pool}"
    return base if user_id in (None, NIL) else f"{base}/user/{user_id}"
