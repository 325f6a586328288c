"""The project's guest image: a Debian cloud kernel with a busybox initramfs whose ``init`` reads a
NoCloud seed, built from Debian packages and cached by a hash of its inputs (``ensure_image``).
``python -m tooling.guest_image`` (``./taskw image:build``) builds it and prints its ``image.json``."""
from .build import GuestImage, ImageBuildError, default_cache_dir, ensure_image

__all__ = ["GuestImage", "ImageBuildError", "default_cache_dir", "ensure_image"]
