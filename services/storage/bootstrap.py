"""The only place storage's adapters are built and wired.

Service settings (read here, once):
  TESSERA_STORAGE_DEFAULT_QUOTA_GB   quota of a tenant without its own limit (default 100000)
"""
from __future__ import annotations

import os
from pathlib import Path

from shared.settings import ServiceSettings
from shared.runtime import Runtime

from .domain.model import StoragePolicy
from .entrypoints import bus


def policy_from_env() -> StoragePolicy:
    """The storage policy from the environment; raises ValueError naming the bad variable."""
    raw = os.environ.get("TESSERA_STORAGE_DEFAULT_QUOTA_GB") or str(StoragePolicy.default_quota_gb)
    try:
        return StoragePolicy(int(raw))
    except ValueError as exc:
        raise ValueError(f"TESSERA_STORAGE_DEFAULT_QUOTA_GB={raw!r}: {exc}") from None


def build(settings: ServiceSettings | None = None, policy: StoragePolicy | None = None) -> Runtime:
    settings = settings or ServiceSettings.from_env("storage")
    rt = Runtime(settings, schema_dir=Path(__file__).parent / "schema")
    bus.wire(rt, policy or policy_from_env())
    return rt
