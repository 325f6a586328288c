"""The allocation service's Prometheus metrics (default registry, served on the runtime's /metrics).

Defined at import (as prometheus_client expects), they connect to nothing."""
from __future__ import annotations

from prometheus_client import Histogram

RESCHEDULE_GAP = Histogram("tessera_allocation_reschedule_gap_seconds",
                           "How long a tenant went without an interrupted allocation: interrupted_at → ACTIVE again "
                           "on another node", buckets=(1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600, 1800))
