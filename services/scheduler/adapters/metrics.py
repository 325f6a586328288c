"""The scheduler's Prometheus metrics (default registry, served on the runtime's /metrics).

Defined at import (as prometheus_client expects), they connect to nothing.
"""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

QUEUE_WAIT = Histogram("tessera_scheduler_queue_wait_seconds",
                       "Time a request waited in the queue before it was placed", ["tenant"], buckets=_WAIT_BUCKETS)
LATENCY = Histogram("tessera_scheduler_decision_seconds",
                    "Scheduling latency: reserve command handled to decision, per tenant and outcome",
                    ["tenant", "outcome"], buckets=_LATENCY_BUCKETS)
PENDING = Gauge("tessera_scheduler_pending", "Requests waiting in the queue", ["tenant"])
PREEMPTIONS = Counter("tessera_scheduler_preemptions_total", "Preemption notices issued", ["pool"])
UTILISATION = Gauge("tessera_scheduler_pool_utilisation_ratio", "Held GPUs / schedulable GPUs", ["pool", "gpu_model"])
FRAGMENTATION = Gauge("tessera_scheduler_fragmentation_ratio",
                      "Share of free GPUs on nodes that cannot serve an 8-GPU request", ["pool", "gpu_model"])
LEADER = Gauge("tessera_scheduler_leader", "1 while this replica is the active scheduler")
