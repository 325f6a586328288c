"""Storage backends by name: ``btrfs`` (real: a subvolume per volume with a qgroup limit) and the rendering
drivers ``lustre``, ``vast`` and ``weka`` (the exact calls those systems would receive, recorded). See ``base``
for the interface.

A storage class names its backend and that backend's options (``TESSERA_STORAGE_CLASSES``): btrfs takes
``root`` (the btrfs mount point; default TESSERA_BTRFS_ROOT), the appliance drivers the fields of their
``*Config``. ``check_options`` vets them when the settings are read; ``make`` builds one backend per class in
bootstrap, touching nothing (no command runs, no appliance is reached).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import StorageBackend
from .btrfs import BtrfsBackend
from .lustre import LustreBackend, LustreConfig
from .vast import VastBackend, VastConfig
from .weka import WekaBackend, WekaConfig

CONFIGS: dict[str, type] = {"lustre": LustreConfig, "vast": VastConfig, "weka": WekaConfig}
APPLIANCES: dict[str, type[StorageBackend]] = {"lustre": LustreBackend, "vast": VastBackend, "weka": WekaBackend}
NAMES = ("btrfs", *APPLIANCES)
SIMULATED = frozenset(APPLIANCES)              # they record their calls: no appliance is reached
_KINDS = {int: "an integer", str: "text", bool: "true or false", float: "a number"}


def check_options(backend: str, options: Mapping[str, Any]) -> None:
    """ValueError saying what is wrong with ``options`` for ``backend`` (an unknown backend too)."""
    if backend == "btrfs":
        unknown = set(options) - {"root"}
        if unknown:
            raise ValueError(f"btrfs takes only the option 'root', not {', '.join(sorted(unknown))}")
        root = options.get("root")
        if root is not None and not (isinstance(root, str) and os.path.isabs(root)):
            raise ValueError(f"btrfs root {root!r} is not an absolute path")
        return
    if backend not in CONFIGS:
        raise ValueError(f"unknown backend {backend!r} (one of {', '.join(NAMES)})")
    fields = {f.name: f for f in dataclasses.fields(CONFIGS[backend])}
    for key, value in options.items():
        if key not in fields:
            raise ValueError(f"{backend} has no option {key!r} (its options: {', '.join(fields)})")
        kind = type(fields[key].default)
        if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
            raise ValueError(f"{backend} option {key!r} must be {_KINDS.get(kind, kind.__name__)}, not {value!r}")
    CONFIGS[backend](**options)                # its own checks (URLs, paths, names)


def make(backend: str, options: Mapping[str, Any], btrfs_root: str) -> StorageBackend:
    """The backend of a class (options checked before: ``check_options``); no I/O."""
    if backend == "btrfs":
        return BtrfsBackend(Path(options.get("root") or btrfs_root))
    return APPLIANCES[backend](CONFIGS[backend](**options))
