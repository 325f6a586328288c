"""A usage meter: one stretch of an allocation's running, started once, cut while it runs, stopped once. An
allocation has one per stretch (a reschedule stops it at the interruption and starts another on the new node),
at most one running.

GPU-seconds = GPUs × elapsed seconds. ``cut_until`` is how far its usage is already recorded (None: nothing
yet); a cut or the stop records [cut_until or started_at, until) and moves it to ``until``, so no second of a
meter is ever recorded twice or skipped. A stop is never dated before ``cut_until`` (usage already recorded
stays billed). ``price`` is the GPU-hour price the allocation was quoted at creation (contracts.PriceSnapshot):
its GPU usage is rated with it for the meter's whole life; None: the price list in force at each hour applies.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class QuotedPrice:
    """The rating terms of a price snapshot (contracts.PriceSnapshot): list price per GPU-hour in integer
    micros, the version's spot discount and whether the allocation is spot."""
    price_list_version: str
    currency: str
    micros_per_gpu_hour: int
    spot_discount_bps: int
    spot: bool
    sku_id: str
    quoted_at: datetime | None = None

    @classmethod
    def from_doc(cls, doc: dict | None) -> QuotedPrice | None:
        """From a snapshot's wire document (extra fields ignored); None for None."""
        if doc is None:
            return None
        quoted = doc.get("quoted_at")
        return cls(doc["price_list_version"], doc["currency"], int(doc["micros_per_gpu_hour"]),
                   int(doc.get("spot_discount_bps", 0)), bool(doc.get("spot", False)), doc["sku_id"],
                   datetime.fromisoformat(quoted) if isinstance(quoted, str) else quoted)

    def as_doc(self) -> dict:
        return {"price_list_version": self.price_list_version, "currency": self.currency,
                "micros_per_gpu_hour": self.micros_per_gpu_hour, "spot_discount_bps": self.spot_discount_bps,
                "spot": self.spot, "sku_id": self.sku_id,
                "quoted_at": self.quoted_at.isoformat() if self.quoted_at else None}


@dataclass
class Meter:
    id: uuid.UUID
    allocation_id: uuid.UUID
    tenant_id: uuid.UUID
    shape: str
    gpu_count: int
    started_at: datetime
    stopped_at: datetime | None = None
    user_id: uuid.UUID | None = None       # what usage is split and priced by (contracts.StartMeter)
    gpu_model: str | None = None
    pool: str | None = None
    spot: bool = False
    cut_until: datetime | None = None      # usage recorded up to here (None: nothing yet)
    price: QuotedPrice | None = None       # the price quoted at creation (None: the list in force)

    @property
    def running(self) -> bool:
        return self.stopped_at is None

    @property
    def recorded_until(self) -> datetime:
        """Where the next cut starts."""
        return self.cut_until or self.started_at

    def stop(self, at: datetime) -> float:
        """Stop the meter (idempotent; never before what is already recorded) and return its GPU-seconds."""
        if self.stopped_at is None:
            self.stopped_at = max(at, self.recorded_until)
        return self.gpu_seconds

    @property
    def gpu_seconds(self) -> float:
        if self.stopped_at is None:
            return 0.0
        return round((self.stopped_at - self.started_at).total_seconds() * self.gpu_count, 3)
