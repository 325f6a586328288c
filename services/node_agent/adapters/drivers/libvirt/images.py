"""The node's image store: an image is copied (or downloaded) once into ``images/<sha256>.<format>`` and used only
after its checksum matched; every instance's disk is a copy-on-write overlay on it. Blocking (the driver calls
it off the event loop).

A checksum mismatch, an unreadable source or a download error raises ``ImageError`` naming the image: the step
fails with it and nothing is kept (the partial copy is removed).
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import urllib.request
from pathlib import Path

from shared.files import replace_atomically

from ....domain.model import BootImage

CHUNK = 1 << 20


class ImageError(RuntimeError):
    """The image cannot be used; str(exc) names it and says why."""


def _copy(source: str, target, name: str) -> None:
    try:
        if source.startswith(("http://", "https://")):
            with urllib.request.urlopen(source, timeout=60) as answer:   # noqa: S310 -- the catalog's URL
                shutil.copyfileobj(answer, target, CHUNK)
        else:
            with open(source, "rb") as f:
                shutil.copyfileobj(f, target, CHUNK)
    except OSError as exc:
        raise ImageError(f"image {name}: cannot read {source}: {exc}") from None


class _Hashing:
    """A file-like target that hashes what it writes on its way to ``target``."""

    def __init__(self, target) -> None:
        self.target, self.digest = target, hashlib.sha256()

    def write(self, block: bytes) -> int:
        self.digest.update(block)
        return self.target.write(block)


def ensure(image: BootImage, images_dir: Path) -> Path:
    """The verified local copy of ``image`` (made on first use); raises ImageError."""
    images_dir.mkdir(parents=True, exist_ok=True)
    local = images_dir / f"{image.sha256}.{image.format}"
    if local.exists():
        return local

    def verified(target) -> None:
        hashing = _Hashing(target)
        _copy(image.source, hashing, image.name)
        got = hashing.digest.hexdigest()
        if got != image.sha256:
            raise ImageError(f"image {image.name}: checksum mismatch: the catalog says sha256 {image.sha256}, "
                             f"{image.source} has {got}")
    # a concurrent provision sees the whole verified file or none; a copy lost in a crash is fetched again
    replace_atomically(local, verified, binary=True, durable=False, mode=0o444)
    return local


def overlay(base: Path, fmt: str, path: Path, min_disk_gb: int) -> None:
    """A qcow2 overlay on ``base`` at ``path``, at least ``min_disk_gb`` GiB virtual (the base's size when larger)."""
    argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", fmt, "-b", str(base), str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise ImageError(f"overlay on {base.name}: {done.stderr.strip()[:500]}")
    grow = subprocess.run(["qemu-img", "resize", "-q", str(path), f"{min_disk_gb}G"], capture_output=True,
                          text=True, timeout=60, check=False)
    if grow.returncode != 0 and "shrink" not in grow.stderr:   # the base is larger already: keep its size
        raise ImageError(f"overlay on {base.name}: {grow.stderr.strip()[:500]}")


def boot_file(source: str | None, images_dir: Path, name: str) -> str | None:
    """A kernel or initramfs for direct boot: a local path as is, a URL downloaded once (by its URL's hash)."""
    if source is None or not source.startswith(("http://", "https://")):
        return source
    local = images_dir / ("boot-" + hashlib.sha256(source.encode()).hexdigest()[:32])
    if not local.exists():   # a cache: a download lost in a crash is fetched again, so no fsync
        replace_atomically(local, lambda target: _copy(source, target, name), binary=True, durable=False)
    return str(local)
