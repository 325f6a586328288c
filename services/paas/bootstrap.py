"""The only place the PaaS service's adapters are built and wired.

Its own settings are ``settings.PaasSettings``, read here, once. One driver per cluster kind: Slurm and Ray run
real daemons on the cluster's nodes; Kubernetes is rendered and recorded (no Kubernetes server runs here). A
driver touches nothing until a cluster is started.
"""
from __future__ import annotations

from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings

from .domain.jobs import JobPolicy
from .entrypoints import bus, loops
from .handlers.reconcile import Runtimes
from .settings import PaasSettings


def drivers(paas: PaasSettings) -> Runtimes:
    """The driver of each cluster kind, each keeping its clusters' state under its own directory."""
    from .adapters.kubernetes.runtime import KubernetesRuntime
    from .adapters.ray.runtime import RayRuntime
    from .adapters.slurm.runtime import SlurmRuntime
    root = Path(paas.state_dir).resolve()
    return {"slurm": SlurmRuntime(root / "slurm"), "ray": RayRuntime(root / "ray"),
            "kubernetes": KubernetesRuntime(root / "kubernetes")}


def build(settings: ServiceSettings | None = None, paas: PaasSettings | None = None,
          runtimes: Runtimes | None = None) -> Runtime:
    """Build the PaaS service; its settings come from the environment unless given, its drivers from those
    settings unless given (by kind)."""
    settings = settings or ServiceSettings.from_env("paas")
    paas = paas or PaasSettings.from_env()
    runtimes = drivers(paas) if runtimes is None else runtimes
    policy = JobPolicy(max_gpus_per_job=paas.max_gpus_per_job, allow_privileged=paas.allow_privileged,
                       allowed_images=paas.allowed_images, max_time_limit_s=paas.max_time_limit_s)
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, runtimes, policy)
    loops.wire(rt, runtimes, paas)
    return rt
