"""Per-tenant GPU quotas by (GPU model, pool) (pure, no I/O).

Rules:
- A tenant with no quota row for (model, pool) may not allocate there: ``check`` answers
  ``ok=False, limit=None`` ("no quota"). Provider admins grant capacity explicitly.
- ``check`` passes while ``used + requested <= limit``: the boundary itself is allowed.
- Lowering a limit below current use never evicts anything: new requests fail until use drops.
- ``guaranteed`` is the share preemption may never take away (see preemption.py); it is
  capped by nothing here: a guarantee above the limit simply protects everything running.
Units are GPUs (a MIG instance counts as one, see shapes.py).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass


class QuotaError(ValueError):
    """A quota definition is invalid."""


@dataclass(frozen=True)
class QuotaKey:
    tenant_id: uuid.UUID
    gpu_model: str
    pool: str

    @property
    def name(self) -> str:
        """The readable quota name problem+json responses use."""
        return f"tenant/{self.tenant_id}/{self.gpu_model}/{self.pool}"


@dataclass(frozen=True)
class QuotaVerdict:
    ok: bool
    quota: str
    limit: int | None
    used: int
    requested: int

    @property
    def reason(self) -> str:
        if self.ok:
            return f"within quota {self.quota}"
        if self.limit is None:
            return f"no quota {self.quota}: the tenant may not allocate {self.requested} GPU(s) there"
        return (f"quota {self.quota} exceeded: limit {self.limit}, in use {self.used}, "
                f"requested {self.requested}")


class QuotaBook:
    """Limits, guarantees and current use. Not thread-safe; the caller serialises access."""

    def __init__(self) -> None:
        self._limits: dict[QuotaKey, tuple[int, int]] = {}
        self._used: dict[QuotaKey, int] = {}

    def set_limit(self, key: QuotaKey, limit: int, guaranteed: int = 0) -> None:
        """Set (or replace) a limit and guarantee; raises QuotaError for negative numbers."""
        for name, v in (("limit", limit), ("guaranteed", guaranteed)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise QuotaError(f"quota {key.name}: {name} must be a non-negative integer, not {v!r}")
        self._limits[key] = (limit, guaranteed)

    def remove(self, key: QuotaKey) -> None:
        """Drop the quota row (use is kept: running allocations are never evicted)."""
        self._limits.pop(key, None)

    def limit(self, key: QuotaKey) -> int | None:
        row = self._limits.get(key)
        return None if row is None else row[0]

    def guaranteed(self, key: QuotaKey) -> int:
        row = self._limits.get(key)
        return 0 if row is None else row[1]

    def unused_guarantees(self) -> dict[str, int]:
        """Pool -> Σ over quotas of (guaranteed − used), each never below zero: what tenants may claim there at
        any moment."""
        out: dict[str, int] = {}
        for key, (_limit, guaranteed) in self._limits.items():
            left = guaranteed - self._used.get(key, 0)
            if left > 0:
                out[key.pool] = out.get(key.pool, 0) + left
        return out

    def used(self, key: QuotaKey) -> int:
        return self._used.get(key, 0)

    def check(self, key: QuotaKey, gpus: int) -> QuotaVerdict:
        """Whether ``gpus`` more fit under the quota. Pure query."""
        limit, used = self.limit(key), self.used(key)
        ok = limit is not None and used + gpus <= limit
        return QuotaVerdict(ok, key.name, limit, used, gpus)

    def fits(self, key: QuotaKey, gpus: int) -> bool:
        """``check(key, gpus).ok`` without building a verdict (the scheduler's hot path)."""
        row = self._limits.get(key)
        return row is not None and self._used.get(key, 0) + gpus <= row[0]

    def charge(self, key: QuotaKey, gpus: int) -> None:
        """Add use unconditionally (the caller checked); also used to load existing holdings."""
        self._used[key] = self._used.get(key, 0) + gpus

    def refund(self, key: QuotaKey, gpus: int) -> None:
        """Remove use, never below zero."""
        left = self._used.get(key, 0) - gpus
        if left > 0:
            self._used[key] = left
        else:
            self._used.pop(key, None)
