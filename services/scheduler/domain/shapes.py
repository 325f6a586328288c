"""Capacity shapes (SKUs) a provider admin defines, validated when built (pure, no I/O).

- ``vm``: a slice of 1, 2, 4 or 8 whole GPUs; each GPU brings its slot (NVMe + IB VF + CPU and
  memory share on its NUMA node).
- ``bare_metal``: the whole node; ``gpu_count`` is the node's GPU count (8 on an HGX), and only a
  node with exactly that many schedulable slots, all free, can host it.
- ``mig``: one MIG instance of ``mig_profile`` on a MIG-capable GPU (``gpu_count`` is 1). A GPU
  serving MIG is partitioned homogeneously (one profile per GPU, as the cloud offerings do), so it
  holds up to ``MIG_PROFILES[profile].per_gpu`` instances; a profile fits only GPUs with the
  memory size it was cut from (``1g.10gb`` comes from an 80 GB GPU).

Quota units: a vm or bare-metal shape counts ``gpu_count`` GPUs; a MIG instance counts as one GPU
(conservative: N MIG instances never occupy more than N GPUs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


class ShapeError(ValueError):
    """A shape definition is invalid."""


@dataclass(frozen=True)
class MigProfile:
    per_gpu: int          # instances of this profile one GPU holds
    gpu_memory_gb: int    # memory of the GPU the profile is cut from


MIG_PROFILES: dict[str, MigProfile] = {
    # A100 40 GB
    "1g.5gb": MigProfile(7, 40), "2g.10gb": MigProfile(3, 40), "3g.20gb": MigProfile(2, 40),
    "4g.20gb": MigProfile(1, 40), "7g.40gb": MigProfile(1, 40),
    # A100 80 GB / H100 80 GB
    "1g.10gb": MigProfile(7, 80), "1g.20gb": MigProfile(4, 80), "2g.20gb": MigProfile(3, 80),
    "3g.40gb": MigProfile(2, 80), "4g.40gb": MigProfile(1, 80), "7g.80gb": MigProfile(1, 80),
    # H200 141 GB
    "1g.18gb": MigProfile(7, 141), "1g.35gb": MigProfile(4, 141), "2g.35gb": MigProfile(3, 141),
    "3g.71gb": MigProfile(2, 141), "4g.71gb": MigProfile(1, 141), "7g.141gb": MigProfile(1, 141),
}

VM_GPU_COUNTS = (1, 2, 4, 8)
KINDS = ("bare_metal", "vm", "mig")


@dataclass(frozen=True)
class Shape:
    name: str
    kind: Literal["bare_metal", "vm", "mig"]
    gpu_count: int
    gpu_model: str | None = None
    mig_profile: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ShapeError("shape name must be a non-empty string")
        if self.kind not in KINDS:
            raise ShapeError(f"shape {self.name}: kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if isinstance(self.gpu_count, bool) or not isinstance(self.gpu_count, int):
            raise ShapeError(f"shape {self.name}: gpu_count must be an integer, not {self.gpu_count!r}")
        if self.gpu_model is not None and (not isinstance(self.gpu_model, str) or not self.gpu_model):
            raise ShapeError(f"shape {self.name}: gpu_model must be a non-empty string or None")
        getattr(self, f"_check_{self.kind}")()

    def _check_vm(self) -> None:
        if self.gpu_count not in VM_GPU_COUNTS:
            raise ShapeError(f"shape {self.name}: a vm slice has 1, 2, 4 or 8 GPUs, not {self.gpu_count}")
        self._no_profile()

    def _check_bare_metal(self) -> None:
        if not 1 <= self.gpu_count <= 64:
            raise ShapeError(f"shape {self.name}: bare_metal gpu_count is the node's GPU count (1..64), "
                             f"not {self.gpu_count}")
        self._no_profile()

    def _check_mig(self) -> None:
        if self.gpu_count != 1:
            raise ShapeError(f"shape {self.name}: a mig shape is one instance on one GPU (gpu_count 1), "
                             f"not {self.gpu_count}")
        if self.mig_profile not in MIG_PROFILES:
            raise ShapeError(f"shape {self.name}: unknown mig_profile {self.mig_profile!r} "
                             f"(known: {', '.join(MIG_PROFILES)})")

    def _no_profile(self) -> None:
        if self.mig_profile is not None:
            raise ShapeError(f"shape {self.name}: only mig shapes have a mig_profile")

    @property
    def quota_units(self) -> int:
        """GPUs charged against quota for one allocation of this shape (see module docstring)."""
        return 1 if self.kind == "mig" else self.gpu_count

    @property
    def mig_per_gpu(self) -> int:
        """Instances of this shape's profile one GPU holds (0 for non-mig shapes)."""
        return MIG_PROFILES[self.mig_profile].per_gpu if self.kind == "mig" else 0


def mig_fits_gpu(profile: str, gpu_memory_gb: int) -> bool:
    """Whether ``profile`` can be cut from a GPU with ``gpu_memory_gb`` of memory."""
    p = MIG_PROFILES.get(profile)
    return p is not None and p.gpu_memory_gb == gpu_memory_gb


# The shapes the platform ships with (contracts.SHAPES names them by the same keys).
STANDARD_SHAPES: dict[str, Shape] = {
    "vm.1gpu": Shape("vm.1gpu", "vm", 1), "vm.2gpu": Shape("vm.2gpu", "vm", 2),
    "vm.4gpu": Shape("vm.4gpu", "vm", 4), "vm.8gpu": Shape("vm.8gpu", "vm", 8),
    "bm.8gpu": Shape("bm.8gpu", "bare_metal", 8),
    "mig.1g.10gb": Shape("mig.1g.10gb", "mig", 1, mig_profile="1g.10gb"),
    "mig.3g.40gb": Shape("mig.3g.40gb", "mig", 1, mig_profile="3g.40gb"),
}
