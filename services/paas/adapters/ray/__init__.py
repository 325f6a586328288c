"""The Ray cluster driver: real Ray (its own venv, ``.venv-ray``), daemons in the tenant's namespace slots."""
from .runtime import RayRuntime

__all__ = ["RayRuntime"]
