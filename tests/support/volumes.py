"""The storage host for the storage service's tests: a real btrfs file system with quotas on a sparse loop file
(one per test session; unmounted and its loop device detached at the end), what is on it, and the service
started with its ``standard`` class there.

Needs root and btrfs-progs (system-packages.txt): a missing tool fails the fixture, it never skips. Every test
uses tenants of its own, so tests sharing the file system look only under their tenants' folders.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from services.storage.adapters.backends.btrfs import ensure_loop_filesystem, unmount_loop_filesystem
from services.storage.bootstrap import build
from services.storage.settings import StorageSettings, read_classes
from tests.support.bus import caused_by, send_command

MiB = 1 << 20
MB = 10 ** 6
PATTERN = b"TESSERA-VOLUME-DATA-"


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


@dataclass(frozen=True)
class BtrfsPool:
    """A mounted btrfs file system with quotas at ``root``."""

    root: Path

    def path(self, tenant_id, volume_id) -> Path:
        return self.root / "tenants" / str(tenant_id) / str(volume_id)

    def subvolumes(self, tenant_id) -> list[Path]:
        """The tenant's volumes on disk (subvolumes under its folder)."""
        folder = self.root / "tenants" / str(tenant_id)
        return sorted(p for p in folder.iterdir() if p.stat().st_ino == 256) if folder.is_dir() else []

    def qgroups(self) -> dict[str, tuple[int, int | None]]:
        """Every qgroup: id → (referenced bytes, referenced limit or None), after a commit."""
        out = _run("btrfs", "qgroup", "show", "-re", "--raw", "--sync", str(self.root))
        rows = {}
        for line in out.splitlines():
            cells = line.split()
            if len(cells) >= 4 and "/" in cells[0] and cells[1].isdigit():
                rows[cells[0]] = (int(cells[1]), None if cells[3] == "none" else int(cells[3]))
        return rows

    def subvolid(self, path: Path) -> int:
        return int(_run("btrfs", "inspect-internal", "rootid", str(path)).strip())

    def qgroup_of(self, path: Path) -> tuple[int, int | None]:
        return self.qgroups()[f"0/{self.subvolid(path)}"]

    def exports(self, volume_id) -> dict | None:
        """The backend's record of who may mount the volume (None: none)."""
        file = self.root / ".tessera" / "exports" / f"{volume_id}.json"
        return json.loads(file.read_text()) if file.exists() else None

    def write(self, path: Path, mib: int, *, pattern: bool = False) -> None:
        """``mib`` MiB into a new file in ``path`` (the pattern, or incompressible bytes), fsynced."""
        chunk = (PATTERN * (MiB // len(PATTERN) + 1))[:MiB] if pattern else None
        with open(path / f"data-{uuid.uuid4().hex[:8]}", "wb") as f:
            for _ in range(mib):
                f.write(chunk or os.urandom(MiB))
            f.flush()
            os.fsync(f.fileno())

    def holds_pattern(self, path: Path) -> bool:
        """Whether any file under ``path`` holds the pattern."""
        return any(PATTERN in p.read_bytes() for p in path.rglob("*") if p.is_file())


@contextlib.contextmanager
def loop_pool(workdir: Path, size_bytes: int = 256 * MiB) -> Iterator[BtrfsPool]:
    """A btrfs file system with quotas in ``workdir/pool.img`` (sparse), mounted at ``workdir/mnt``; unmounted after."""
    mount_point = workdir / "mnt"
    try:
        yield BtrfsPool(ensure_loop_filesystem(workdir / "pool.img", mount_point, size_bytes))
    finally:
        unmount_loop_filesystem(mount_point)


def storage_settings(pool: BtrfsPool, classes: dict | None = None, **settings) -> StorageSettings:
    """The service's settings: ``standard`` (btrfs on ``pool``, the default) plus ``classes``."""
    all_classes = {"standard": {"backend": "btrfs", "default": True, "root": str(pool.root)}, **(classes or {})}
    return StorageSettings(classes=read_classes(json.dumps(all_classes)), btrfs_root=str(pool.root), **settings)


async def start_storage(run_service, pool: BtrfsPool, classes: dict | None = None, **settings):
    """The storage service (its real bootstrap) with ``storage_settings``; returns its runtime."""
    return await run_service("storage", partial(build, storage=storage_settings(pool, classes, **settings)))


def volume_event(volume_id, pred=lambda v: True):
    """Predicate for StreamWatcher.wait_for: a volume_changed of that volume whose volume ``pred`` picks."""
    return lambda i: (i[1]["type"] == "storage.volume_changed" and i[1]["data"]["volume"]["volume_id"] == str(volume_id)
                      and pred(i[1]["data"]["volume"]))


async def command(js, events, type_: str, data: dict) -> dict:
    """Send a volume command; returns the volume the service answered with (its one volume_changed)."""
    env, _ = await send_command(js, type_, data)
    [hit] = await events.wait_for(lambda i: caused_by(env)(i) and i[1]["type"] == "storage.volume_changed")
    return hit[1]["data"]["volume"]


async def create(js, events, tenant, size_bytes: int, *, name: str | None = None, storage_class: str = "standard",
                 user=None, shared: bool = False, volume_id=None) -> dict:
    """Create a volume; returns the volume answered (available or rejected)."""
    volume_id = volume_id or uuid.uuid4()
    return await command(js, events, "storage.create_volume", {
        "volume_id": volume_id, "tenant_id": tenant, "user_id": user or uuid.uuid4(),
        "name": name or f"v-{uuid.UUID(str(volume_id)).hex[:12]}", "storage_class": storage_class,
        "size_bytes": size_bytes, "shared": shared})


async def set_quota(js, watcher, tenant, storage_class: str = "standard", *, user=None, max_bytes=None,
                    max_volumes=None) -> dict:
    """Set a quota; returns the service's storage.quota_changed."""
    env, _ = await send_command(js, "storage.set_quota", {
        "tenant_id": tenant, "storage_class": storage_class, "user_id": user, "max_bytes": max_bytes,
        "max_volumes": max_volumes, "set_by": uuid.uuid4()})
    [hit] = await watcher.wait_for(caused_by(env))
    return hit[1]["data"]
