"""``python -m tooling.guest_image [--cache-dir DIR]``: build (or find cached) the guest image, print its image.json."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .build import ImageBuildError, default_cache_dir, ensure_image


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tooling.guest_image", description=__doc__)
    parser.add_argument("--cache-dir", type=Path, default=None, help=f"image cache (default: {default_cache_dir()})")
    args = parser.parse_args(argv)
    try:
        image = ensure_image(args.cache_dir, log=lambda msg: print(msg, file=sys.stderr))
    except ImageBuildError as exc:
        print(f"image build failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(image.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
