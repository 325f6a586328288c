"""The tree passes ruff with the project's rule set (pyproject.toml: [tool.ruff]): the suite fails on a violation,
as `./taskw lint` does."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_tree_passes_ruff():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "--no-cache", "."],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
