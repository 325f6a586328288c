"""The CLI is a client of the public API: it imports nothing of the services, the kit or the tooling, no
async HTTP stack and no validation library, and its modules import each other without a circle. A cold
`tessera --help` loads no noun, no rich and no HTTP client."""
from __future__ import annotations

import subprocess
import sys

from tests.contract.test_import_graph import circles, import_graph
from tests.support.imports import REPO, imported_names, py_files

FORBIDDEN = ("services", "shared", "tooling", "tests", "aiohttp", "pydantic", "nats", "asyncpg", "requests", "httpx")


def test_the_cli_imports_only_the_standard_library_typer_rich_and_yaml():
    for path in py_files("cli"):
        bad = sorted(n for n in imported_names(path) if n.split(".")[0] in FORBIDDEN)
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_no_import_circle_in_the_cli():
    assert circles(import_graph("cli")) == []


def test_help_loads_no_noun_no_rich_and_no_http_client():
    probe = ("import sys\nfrom cli.app import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
             "print('LOADED:' + ','.join(sorted(m for m in sys.modules if m.startswith(('cli.commands.', 'rich', 'http.client', "
             "'yaml')))))")
    out = subprocess.run([sys.executable, "-c", probe, "--help"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "LOADED:", out
