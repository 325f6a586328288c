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

# node health (handlers/health.py)
_FAILOVER_BUCKETS = (0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 120, 300, 600)
DETECTION_TO_CORDON = Histogram("tessera_health_detection_to_cordon_seconds",
                                "From when a condition began (the alert's since, or the last heartbeat) to the "
                                "automatic cordon it caused", ["condition"], buckets=_FAILOVER_BUCKETS)
INTERRUPTION_INTERVAL = Histogram("tessera_health_interruption_interval_seconds",
                                  "Time between two drains of the same node (its allocations interrupted)",
                                  buckets=(60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400))
NODE_STATE = Gauge("tessera_health_nodes", "Watched nodes by health state", ["state"])
BREAKER_OPEN = Gauge("tessera_health_breaker_open", "1 while the pool's automatic-cordon breaker is open", ["pool"])
