"""The Slurm cluster driver: real slurmctld/slurmd/slurmrestd daemons in the tenant's node namespaces."""
from .runtime import SlurmRuntime

__all__ = ["SlurmRuntime"]
