"""The PaaS service's own settings (besides the kit's), read from the environment in bootstrap, never at import."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.settings import choice, flag, integer, load, number, setting, text


def _patterns(raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


@dataclass(frozen=True)
class PaasSettings:
    state_dir: str = setting("TESSERA_PAAS_STATE_DIR", ".data/paas", text,
                             doc="where the tenant clusters' drivers keep their per-cluster state (configuration, "
                                 "keys, sockets, logs)")
    nodes: str = setting("TESSERA_PAAS_NODES", "netns", choice("netns", "remote"),
                         doc="`netns`: a cluster's nodes are namespace slots on this host (the sim node driver with "
                             "the kernel dataplane): daemons run in each slot's network namespace; `remote`: on the "
                             "node at its address")
    reconcile_s: float = setting("TESSERA_PAAS_RECONCILE_S", 0.25, number(0.01),
                                 doc="how often the reconciler starts, scales and stops clusters and follows jobs")
    utilisation: str = setting("TESSERA_PAAS_UTILISATION", "metrics", choice("metrics", "scheduler"),
                               doc="where the autoscaler reads a node's GPU utilisation: `metrics` (the node-agents' "
                                   "GPU metrics) or `scheduler` (the share of its GPUs the cluster's scheduler gave to "
                                   "jobs: for simulated GPUs, whose metrics say nothing of the work)")
    autoscale_tick_s: float = setting("TESSERA_PAAS_AUTOSCALE_TICK_S", 15.0, number(0.1),
                                      doc="how often the autoscaler decides (NVIDIA's function autoscaler: 15 s)")
    autoscale_window_s: float = setting("TESSERA_PAAS_AUTOSCALE_WINDOW_S", 70.0, number(0.1),
                                        doc="the window its utilisation is the mean over (NVIDIA's: 70 s)")
    spot_usage_s: float = setting("TESSERA_PAAS_SPOT_USAGE_S", 15.0, number(0.05),
                                  doc="how often the spot market is asked what its workloads use of the offered "
                                      "nodes (`report_usage`), shown on the offering")
    max_gpus_per_job: int = setting("TESSERA_PAAS_MAX_GPUS_PER_JOB", 64, integer(0),
                                    doc="the most GPUs one job may ask for (tasks × gpus_per_task)")
    allow_privileged: bool = setting("TESSERA_PAAS_ALLOW_PRIVILEGED", False, flag,
                                     doc="`1`: jobs may ask for a privileged run (never by default)")
    allowed_images: tuple[str, ...] = setting("TESSERA_PAAS_ALLOWED_IMAGES", (), _patterns,
                                              doc="comma-separated glob patterns of the container images jobs may "
                                                  "use (Kubernetes clusters); empty: any")
    max_time_limit_s: int = setting("TESSERA_PAAS_MAX_TIME_LIMIT_S", 7 * 86400, integer(60),
                                    doc="the longest time limit a job may ask for")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PaasSettings:
        return load(cls, environ)
