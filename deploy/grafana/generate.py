"""Write the dashboards' JSON under deploy/grafana/dashboards/ (what Grafana's provisioning loads), or check it.

    python -m deploy.grafana.generate           # rewrite the files
    python -m deploy.grafana.generate --check   # exit 1 when a file differs from what the code builds

The JSON is committed (Grafana reads files, not Python); tests/contract/test_grafana.py fails when it and the
code disagree.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .boards import api, billing, fleet, message_kit, sagas, scheduling
from .gpu import gpu_health

DASHBOARDS = Path(__file__).resolve().parent / "dashboards"
BOARDS = {"fleet": fleet, "scheduling": scheduling, "sagas": sagas, "message-kit": message_kit,
          "billing": billing, "gpu-health": gpu_health, "api": api}


def rendered() -> dict[str, str]:
    """File name -> the JSON text of each dashboard."""
    return {f"{name}.json": json.dumps(build(), indent=2, ensure_ascii=False) + "\n" for name, build in BOARDS.items()}


def main(argv: list[str]) -> int:
    files = rendered()
    if "--check" in argv:
        stale = [n for n, text in files.items() if not (DASHBOARDS / n).exists() or (DASHBOARDS / n).read_text() != text]
        for n in stale:
            print(f"deploy/grafana/dashboards/{n} is not what the code builds: python -m deploy.grafana.generate")
        return 1 if stale else 0
    DASHBOARDS.mkdir(exist_ok=True)
    for n, text in files.items():
        (DASHBOARDS / n).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
