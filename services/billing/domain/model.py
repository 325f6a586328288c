"""A usage meter per allocation: started once, stopped once; GPU-seconds = GPUs × elapsed seconds."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime


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

    @property
    def running(self) -> bool:
        return self.stopped_at is None

    def stop(self, at: datetime) -> float:
        """Stop the meter (idempotent) and return the GPU-seconds it measured."""
        if self.stopped_at is None:
            self.stopped_at = max(at, self.started_at)
        return self.gpu_seconds

    @property
    def gpu_seconds(self) -> float:
        if self.stopped_at is None:
            return 0.0
        return round((self.stopped_at - self.started_at).total_seconds() * self.gpu_count, 3)
