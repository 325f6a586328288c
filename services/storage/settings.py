"""Storage's own settings, read from the environment once, in bootstrap (never at import time).

Environment variables (defaults in brackets):
  TESSERA_STORAGE_DEFAULT_QUOTA_GB   [100000]  quota in GB of a tenant without its own limit (an integer ≥ 0)
"""
from __future__ import annotations

from dataclasses import dataclass

from shared.settings import integer, setting

from .domain.model import StoragePolicy


@dataclass(frozen=True)
class StorageSettings:
    default_quota_gb: int = setting("TESSERA_STORAGE_DEFAULT_QUOTA_GB", StoragePolicy.default_quota_gb, integer(0),
                                    doc="quota in GB of a tenant without its own limit")

    @property
    def policy(self) -> StoragePolicy:
        return StoragePolicy(self.default_quota_gb)
