"""What every generator of a committed file shares (the AsyncAPI documents, the bus permissions, the code map):
the diff that says how the committed text differs from the generated one, and the command line that either
checks (exit 1 on a difference) or writes."""
from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Iterable
from pathlib import Path


def text_diff(committed: str, generated: str, name: str, *, most: int | None = None, context: int = 3) -> list[str]:
    """The unified diff from the ``committed`` text of ``name`` to the ``generated`` one ([]: the same), cut to
    its first ``most`` lines."""
    diff = difflib.unified_diff(committed.splitlines(), generated.splitlines(), f"{name} (committed)",
                                f"{name} (generated)", lineterm="", n=context)
    return list(diff)[:most]


def check_or_write(argv: list[str] | None, *, module: str, description: str, option: str, default: Path,
                   what: str, differences: Callable[[Path], list[str]], write: Callable[[Path], Iterable[Path]],
                   stale: str, fresh: str) -> int:
    """``python -m <module> [--check] [--<option> PATH]``: with --check, print each of ``differences(PATH)`` and
    ``stale`` (then exit 1) or ``fresh`` (``{path}`` and ``{count}`` filled in); else write and name each file.
    ``what`` is the help of the path option."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    parser.add_argument(f"--{option}", type=Path, default=default, help=what)
    args = parser.parse_args(argv)
    path = getattr(args, option)
    if args.check:
        problems = differences(path)
        for p in problems:
            print(p)
        if problems:
            print(f"\n{stale.format(path=path, count=len(problems))}: run `python -m {module}`.")
            return 1
        print(fresh.format(path=path, count=0))
        return 0
    for written in write(path):
        print(f"wrote {written}")
    return 0
