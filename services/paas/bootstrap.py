"""The only place the PaaS service's adapters are built and wired.

Its own settings are ``settings.PaasSettings``, read here, once. One driver per cluster kind: Slurm and Ray run
real daemons on the cluster's nodes; Kubernetes is rendered and recorded (no Kubernetes server runs here). A
driver touches nothing until a cluster is started.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from shared.runtime import Runtime
from shared.settings import ServiceSettings

from .domain.jobs import JobPolicy
from .domain.spot import SpotCapacityProvider
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


def spot_providers(paas: PaasSettings) -> Callable[[str], SpotCapacityProvider]:
    """A pool's spot-capacity driver: NVCF-shaped, recording each call to ``<state dir>/spot/<pool>.jsonl``."""
    from .adapters.spot.nvcf import RecordingNvcfProvider
    root = Path(paas.state_dir).resolve() / "spot"
    return lambda pool: RecordingNvcfProvider(root / f"{pool}.jsonl")


def build(settings: ServiceSettings | None = None, paas: PaasSettings | None = None,
          runtimes: Runtimes | None = None,
          spot_provider_of: Callable[[str], SpotCapacityProvider] | None = None) -> Runtime:
    """Build the PaaS service; its settings come from the environment unless given, its drivers (by kind) and
    its spot market's driver (by pool) from those settings unless given."""
    settings = settings or ServiceSettings.from_env("paas")
    paas = paas or PaasSettings.from_env()
    runtimes = drivers(paas) if runtimes is None else runtimes
    policy = JobPolicy(max_gpus_per_job=paas.max_gpus_per_job, allow_privileged=paas.allow_privileged,
                       allowed_images=paas.allowed_images, max_time_limit_s=paas.max_time_limit_s)
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, runtimes, policy)
    loops.wire(rt, runtimes, paas, spot_provider_of or spot_providers(paas))
    return rt
