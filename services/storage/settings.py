"""Storage's own settings, read from the environment once, in bootstrap (never at import time); a bad value raises
``SettingError`` naming the variable. Variables (defaults in brackets):

  TESSERA_STORAGE_CLASSES               [{"standard": {"backend": "btrfs", "default": true}}] the storage classes, a
                                        JSON object: class name → {"backend": "btrfs" | "lustre" | "vast" | "weka",
                                        "description": text, "max_volume_bytes": int, "default": bool, and the
                                        backend's options: btrfs "root"; lustre, vast, weka: their Config's fields}.
                                        Exactly one class is the default (the first when none says so).
  TESSERA_BTRFS_ROOT                    [/var/lib/tessera/volumes] the btrfs mount point of a btrfs class without
                                        its own "root"
  TESSERA_STORAGE_DEFAULT_QUOTA_GB      [100000] a tenant's quota in a class without its own limit, GB (10**9 bytes)
  TESSERA_STORAGE_DEFAULT_QUOTA_VOLUMES [100] a tenant's number of volumes in a class without its own limit
  TESSERA_STORAGE_USAGE_INTERVAL_S      [30] seconds between two usage reports (≥ 0.2)
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from shared.settings import integer, number, setting

from .adapters.backends import SIMULATED, StorageBackend, check_options, make
from .domain.model import GB, MAX_VOLUME_BYTES, StorageClass, StoragePolicy

CLASS_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
MIN_VOLUME_BYTES = 1 << 20
_COMMON = {"backend", "description", "max_volume_bytes", "default"}


@dataclass(frozen=True)
class ClassSetting:
    """One storage class as configured: the class, and its backend's options."""

    storage_class: StorageClass
    options: Mapping[str, Any] = field(default_factory=dict)


def _class(name: str, spec: Any) -> ClassSetting:
    if not CLASS_NAME.fullmatch(name):
        raise ValueError(f"class name {name!r} is not [a-z0-9][a-z0-9-]{{0,31}}")
    if not isinstance(spec, dict):
        raise ValueError(f"class {name!r} is not an object")
    backend, description = spec.get("backend"), spec.get("description", "")
    max_bytes, default = spec.get("max_volume_bytes", MAX_VOLUME_BYTES), spec.get("default", False)
    if not isinstance(description, str) or len(description) > 500:
        raise ValueError(f"class {name!r}: description must be text of at most 500 characters")
    if type(max_bytes) is not int or not MIN_VOLUME_BYTES <= max_bytes <= MAX_VOLUME_BYTES:
        raise ValueError(f"class {name!r}: max_volume_bytes must be an integer in [{MIN_VOLUME_BYTES}, "
                         f"{MAX_VOLUME_BYTES}]")
    if not isinstance(default, bool):
        raise ValueError(f"class {name!r}: default must be true or false")
    options = {k: v for k, v in spec.items() if k not in _COMMON}
    try:
        check_options(str(backend), options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"class {name!r}: {exc}") from None
    klass = StorageClass(name, backend, description, max_bytes, default, simulated=backend in SIMULATED)
    return ClassSetting(klass, MappingProxyType(options))


def read_classes(raw: str) -> tuple[ClassSetting, ...]:
    """TESSERA_STORAGE_CLASSES → the classes, exactly one the default; ValueError saying what is wrong."""
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"a JSON object of storage classes: {exc}") from None
    if not isinstance(document, dict) or not document:
        raise ValueError("a JSON object of storage classes: it must name at least one class")
    try:
        classes = [_class(name, spec) for name, spec in document.items()]
    except ValueError as exc:
        raise ValueError(f"a usable set of storage classes: {exc}") from None
    defaults = [c.storage_class.name for c in classes if c.storage_class.default]
    if len(defaults) > 1:
        raise ValueError(f"a usable set of storage classes: only one may be the default, not {', '.join(defaults)}")
    if not defaults:
        first = classes[0]
        classes[0] = ClassSetting(replace(first.storage_class, default=True), first.options)
    return tuple(classes)


DEFAULT_CLASSES = read_classes('{"standard": {"backend": "btrfs", "default": true}}')


def _absolute(raw: str) -> str:
    if not os.path.isabs(raw):
        raise ValueError(raw)
    return raw


_absolute.what = "an absolute path"   # type: ignore[attr-defined]


@dataclass(frozen=True)
class StorageSettings:
    classes: tuple[ClassSetting, ...] = setting("TESSERA_STORAGE_CLASSES", DEFAULT_CLASSES, read_classes,
                                                doc="the storage classes (JSON: name → backend and options)")
    btrfs_root: str = setting("TESSERA_BTRFS_ROOT", "/var/lib/tessera/volumes", _absolute,
                              doc="the btrfs mount point of a btrfs class without its own root")
    default_quota_gb: int = setting("TESSERA_STORAGE_DEFAULT_QUOTA_GB", 100_000, integer(0),
                                    doc="quota in GB of a tenant in a class without its own limit")
    default_quota_volumes: int = setting("TESSERA_STORAGE_DEFAULT_QUOTA_VOLUMES", 100, integer(0),
                                         doc="volumes of a tenant in a class without its own limit")
    usage_interval_s: float = setting("TESSERA_STORAGE_USAGE_INTERVAL_S", 30.0, number(0.2),
                                      doc="seconds between two usage reports")

    @property
    def policy(self) -> StoragePolicy:
        return StoragePolicy(tuple(c.storage_class for c in self.classes), self.default_quota_gb * GB,
                             self.default_quota_volumes)

    def backends(self) -> dict[str, StorageBackend]:
        """One backend per class, by class name (built, nothing touched)."""
        return {c.storage_class.name: make(c.storage_class.backend, c.options, self.btrfs_root) for c in self.classes}
